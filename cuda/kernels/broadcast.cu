#include "cuda/kernels/broadcast.h"

#include <array>
#include <limits>
#include <type_traits>

#include "core/math/broadcast.h"
#include "core/math/elementwise.h"
#include "core/op_dispatch.h"
#include "cuda/kernels/common.cuh"
#include "cuda/kernels/split_totals.cuh"

namespace mixprec::kernels {
namespace {

// ---- planning (host) ------------------------------------------------------------------------

void check_dims(const char* op, size_t ndim) {
  MIXPREC_CHECK(ndim <= static_cast<size_t>(kMaxDims), op, ": the shapes need ", ndim,
                " dimensions after merging, more than the CUDA backend's ", kMaxDims,
                "; reshape the operands to fewer dimensions");
}

// ---- device index arithmetic ----------------------------------------------------------------

template <class Index>
struct Dims {
  int ndim = 0;
  Index extents[kMaxDims] = {};
  Index strides[kMaxDims] = {};
  // Offset of the `index`-th point of the walk over the first `dims` dims.
  __device__ __forceinline__ Index offset(Index index, int dims) const {
    return offset_of(index, dims, extents, strides);
  }
};

template <class Index>
Dims<Index> make_dims(const std::vector<int64_t>& extents, const std::vector<int64_t>& strides,
                      size_t count) {
  Dims<Index> d;
  d.ndim = static_cast<int>(count);
  for (size_t i = 0; i < count; ++i) {
    d.extents[i] = static_cast<Index>(extents[i]);
    d.strides[i] = static_cast<Index>(strides[i]);
  }
  return d;
}

template <int N, class Index>
struct BroadcastArgs {
  int ndim = 0;
  Index extents[kMaxDims] = {};
  Index strides[N][kMaxDims] = {};
};

// ---- broadcast map ----------------------------------------------------------------------------

template <BinaryOp Op>
struct BinaryFn {
  __device__ float operator()(float a, float b) const { return binary_value<Op>(a, b); }
};

// The one-element operand is read through its pointer on the device.
template <BinaryOp Op, class T, bool kScalarRight>
struct ScalarOperandFn {
  const T* s;
  __device__ float operator()(float v) const {
    const float c = to_float(*s);
    if constexpr (kScalarRight) return binary_value<Op>(v, c);
    else return binary_value<Op>(c, v);
  }
};

struct ScaleFn {
  float scale;
  __device__ float operator()(float x) const { return scale * x; }
};

// One output element per thread; consecutive threads write consecutive outputs, and each
// input's innermost stride is 1 or 0, so loads are coalesced or broadcast.
template <class T, int N, class Index, class F>
__global__ void __launch_bounds__(kThreads) broadcast_kernel(Inputs<T, N> in, T* out, Index n,
                                                            BroadcastArgs<N, Index> plan, F f) {
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    Index rest = i;
    Index off[N] = {};
    for (int d = plan.ndim - 1; d >= 0; --d) {
      const Index e = plan.extents[d];
      const Index c = rest % e;
      rest /= e;
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += c * plan.strides[k][d];
    }
    Pack<T, 1> x[N];
#pragma unroll
    for (int k = 0; k < N; ++k) x[k].v[0] = in.p[k][off[k]];
    out[i] = from_float<T>(apply_at(f, x, 0));
  }
}

template <class T, int N, class Index, class F>
void launch_broadcast_as(const BroadcastPlan<N>& plan, const Inputs<T, N>& in, T* out, int64_t n,
                         const F& f, cudaStream_t stream) {
  BroadcastArgs<N, Index> args;
  args.ndim = static_cast<int>(plan.extents.size());
  for (int d = 0; d < args.ndim; ++d) {
    args.extents[d] = static_cast<Index>(plan.extents[d]);
    for (int k = 0; k < N; ++k) args.strides[k][d] = static_cast<Index>(plan.strides[k][d]);
  }
  MIXPREC_LAUNCH(grid_for(n), kThreads, stream, broadcast_kernel<T, N, Index, F>)(in, out,
      static_cast<Index>(n), args, f);
  CUDA_CHECK_LAST();
}

template <class T, int N, class F>
void launch_broadcast(const char* op, const Shape& out_shape,
                      const std::array<const Shape*, N>& in_shapes, const Inputs<T, N>& in, T* out,
                      const F& f, cudaStream_t stream) {
  const int64_t n = shape_numel(out_shape);
  if (n <= 0) return;
  const BroadcastPlan<N> plan = plan_broadcast<N>(out_shape, in_shapes);
  check_dims(op, plan.extents.size());
  // Inputs broadcast to the output, so no input offset exceeds n.
  if (fits_32_bits(n)) launch_broadcast_as<T, N, uint32_t>(plan, in, out, n, f, stream);
  else launch_broadcast_as<T, N, uint64_t>(plan, in, out, n, f, stream);
}

// ---- sum_to -----------------------------------------------------------------------------------

// Work per split: x elements per block when the innermost dim is summed, rows of the
// reduced dims per block otherwise.
constexpr int64_t kSplitElements = 8192;
constexpr int64_t kSplitRows = 256;
constexpr int64_t kMaxSplits = 1024;
// Bound on the scratch of partial sums (floats).
constexpr int64_t kMaxScratch = int64_t{1} << 22;
// Column tile of the kept-innermost kernel: a warp reads 32 consecutive columns, and the
// block's kRowLanes warps read different reduced rows.
constexpr int kTileColumns = 32;
constexpr int kRowLanes = kThreads / kTileColumns;

template <class Index>
struct ReduceArgs {
  Dims<Index> kept;
  Dims<Index> reduced;
  Index outputs = 0;
  Index reduced_count = 0;
  Index per_split = 0;
  int splits = 1;
};

// Stores one output, or its split's partial sum when there are several splits.
template <class T, class Index>
__device__ __forceinline__ void store_sum(T* y, float* scratch, const ReduceArgs<Index>& a,
                                          Index o, float total, float scale) {
  if (a.splits == 1) y[o] = from_float<T>(scale * total);
  else scratch[static_cast<Index>(blockIdx.y) * a.outputs + o] = total;
}

// The innermost dim is summed: a block per output and split; its threads walk the split's
// reduced positions (contiguous along the innermost dim), then add up in a fixed tree.
template <class T, class Index>
__global__ void __launch_bounds__(kThreads) sum_inner_kernel(const T* x, T* y, float* scratch,
                                                            ReduceArgs<Index> a, float scale) {
  __shared__ float shared[kThreads];
  const Index begin = static_cast<Index>(blockIdx.y) * a.per_split;
  const Index end = begin + a.per_split < a.reduced_count ? begin + a.per_split : a.reduced_count;
  for (Index o = blockIdx.x; o < a.outputs; o += gridDim.x) {
    const Index base = a.kept.offset(o, a.kept.ndim);
    float acc = 0.0f;
    for (Index r = begin + threadIdx.x; r < end; r += kThreads) {
      acc += to_float(x[base + a.reduced.offset(r, a.reduced.ndim)]);
    }
    const float total = block_sum(acc, shared);
    if (threadIdx.x == 0) store_sum(y, scratch, a, o, total, scale);
    __syncthreads();
  }
}

// The innermost dim is kept: a block per 32-column tile of one output row and split; lane
// (column, row lane) sums every kRowLanes-th reduced row, and row lane 0 adds the lanes in
// order.
template <class T, class Index>
__global__ void __launch_bounds__(kThreads) sum_outer_kernel(const T* x, T* y, float* scratch,
                                                            ReduceArgs<Index> a, float scale) {
  __shared__ float shared[kRowLanes][kTileColumns];
  const int tx = threadIdx.x % kTileColumns;
  const int ty = threadIdx.x / kTileColumns;
  const int last = a.kept.ndim - 1;
  const Index inner = a.kept.extents[last];
  const Index tiles = (inner + kTileColumns - 1) / kTileColumns;
  const Index tasks = a.outputs / inner * tiles;
  const Index begin = static_cast<Index>(blockIdx.y) * a.per_split;
  const Index end = begin + a.per_split < a.reduced_count ? begin + a.per_split : a.reduced_count;
  for (Index task = blockIdx.x; task < tasks; task += gridDim.x) {
    const Index row = task / tiles;
    const Index col = task % tiles * kTileColumns + tx;
    float acc = 0.0f;
    if (col < inner) {
      const Index base = a.kept.offset(row, last) + col;
      for (Index r = begin + ty; r < end; r += kRowLanes) {
        acc += to_float(x[base + a.reduced.offset(r, a.reduced.ndim)]);
      }
    }
    shared[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && col < inner) {
      float total = 0.0f;
#pragma unroll
      for (int k = 0; k < kRowLanes; ++k) total += shared[k][tx];
      store_sum(y, scratch, a, row * inner + col, total, scale);
    }
    __syncthreads();
  }
}

// y[o] = scale * (sum of the splits' partials of output o, added by a warp:
// warp_split_total).
template <class T>
__global__ void __launch_bounds__(kThreads) sum_splits_kernel(const float* scratch, T* y,
                                                             int64_t outputs, int64_t splits,
                                                             float scale) {
  for (int64_t o = first_warp_output(); o < outputs; o += warp_output_stride()) {
    const float total = warp_split_total(scratch + o, splits, outputs);
    if (first_lane()) y[o] = from_float<T>(scale * total);
  }
}

template <class T, class Index>
void launch_sum_to(const SumToPlan& plan, const T* x, T* y, float scale, float* scratch,
                   cudaStream_t stream) {
  ReduceArgs<Index> a;
  a.kept = make_dims<Index>(plan.kept_extents, plan.kept_strides, plan.kept_extents.size());
  a.reduced = make_dims<Index>(plan.reduced_extents, plan.reduced_strides,
                               plan.reduced_extents.size());
  a.outputs = static_cast<Index>(plan.outputs);
  a.reduced_count = static_cast<Index>(plan.reduced);
  a.per_split = static_cast<Index>(plan.per_split);
  a.splits = static_cast<int>(plan.splits);
  const unsigned splits = static_cast<unsigned>(plan.splits);
  if (plan.inner_reduced) {
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(plan.outputs, kMaxBlocks));
    MIXPREC_LAUNCH(dim3(blocks, splits), kThreads, stream, sum_inner_kernel<T, Index>)(x, y,
        scratch, a, scale);
  } else {
    const int64_t inner = plan.kept_extents.back();
    const int64_t tasks = plan.outputs / inner * ((inner + kTileColumns - 1) / kTileColumns);
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(tasks, kMaxBlocks));
    MIXPREC_LAUNCH(dim3(blocks, splits), kThreads, stream, sum_outer_kernel<T, Index>)(x, y,
        scratch, a, scale);
  }
  CUDA_CHECK_LAST();
  if (plan.splits > 1) {
    MIXPREC_LAUNCH(warp_per_output_grid(plan.outputs), kThreads, stream,
                   sum_splits_kernel<T>)(scratch, y,
        plan.outputs, plan.splits, scale);
    CUDA_CHECK_LAST();
  }
}

}  // namespace

void binary(BinaryOp op, DType dtype, const void* a, const Shape& a_shape, const void* b,
            const Shape& b_shape, void* out, const Shape& out_shape, cudaStream_t stream) {
  const int64_t n = shape_numel(out_shape);
  if (n <= 0) return;
  const int64_t na = shape_numel(a_shape), nb = shape_numel(b_shape);
  const bool a_full = na == n, b_full = nb == n;
  MIXPREC_CUDA_DISPATCH_FLOATING(dtype, "binary", [&] {
    using T = scalar_t;
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    T* po = static_cast<T*>(out);
    with_binary_op(op, [&](auto tag) {
      constexpr BinaryOp kOp = decltype(tag)::value;
      if (a_full && b_full) {
        launch_map<T, 2>({pa, pb}, po, n, BinaryFn<kOp>{}, stream);
      } else if (a_full && nb == 1) {
        launch_map<T, 1>({pa}, po, n, ScalarOperandFn<kOp, T, true>{pb}, stream);
      } else if (b_full && na == 1) {
        launch_map<T, 1>({pb}, po, n, ScalarOperandFn<kOp, T, false>{pa}, stream);
      } else {
        Inputs<T, 2> in;
        in.p[0] = pa;
        in.p[1] = pb;
        launch_broadcast<T, 2>("binary", out_shape, {&a_shape, &b_shape}, in, po, BinaryFn<kOp>{},
                               stream);
      }
    });
  });
}

void expand(DType dtype, const void* x, const Shape& x_shape, void* y, const Shape& y_shape,
            float scale, cudaStream_t stream) {
  const int64_t n = shape_numel(y_shape);
  if (n <= 0) return;
  MIXPREC_CUDA_DISPATCH_FLOATING(dtype, "expand", [&] {
    using T = scalar_t;
    const T* px = static_cast<const T*>(x);
    T* py = static_cast<T*>(y);
    if (shape_numel(x_shape) == n) {
      launch_map<T, 1>({px}, py, n, ScaleFn{scale}, stream);
      return;
    }
    Inputs<T, 1> in;
    in.p[0] = px;
    launch_broadcast<T, 1>("expand", y_shape, {&x_shape}, in, py, ScaleFn{scale}, stream);
  });
}

SumToPlan plan_sum_to(const Shape& x_shape, const Shape& y_shape) {
  SumToPlan plan;
  plan.x_numel = shape_numel(x_shape);
  plan.outputs = shape_numel(y_shape);
  MIXPREC_CHECK(plan.x_numel > 0 && plan.outputs > 0 && plan.outputs < plan.x_numel,
                "sum_to: nothing to reduce from ", shape_str(x_shape), " to ", shape_str(y_shape));
  plan.reduced = plan.x_numel / plan.outputs;

  SumToDims dims = split_sum_to(x_shape, y_shape);
  plan.kept_extents = std::move(dims.kept_extents);
  plan.kept_strides = std::move(dims.kept_strides);
  plan.reduced_extents = std::move(dims.reduced_extents);
  plan.reduced_strides = std::move(dims.reduced_strides);
  plan.inner_reduced = dims.inner_reduced;
  check_dims("sum_to", plan.kept_extents.size());
  check_dims("sum_to", plan.reduced_extents.size());

  const int64_t target = plan.inner_reduced ? kSplitElements : kSplitRows;
  int64_t splits = (plan.reduced + target - 1) / target;
  splits = std::min(splits, kMaxSplits);
  splits = std::min(splits, std::max<int64_t>(1, kMaxScratch / plan.outputs));
  splits = std::max<int64_t>(splits, 1);
  plan.per_split = (plan.reduced + splits - 1) / splits;
  // Rounding per_split up can leave trailing splits empty; drop them.
  plan.splits = (plan.reduced + plan.per_split - 1) / plan.per_split;
  return plan;
}

void sum_to(const SumToPlan& plan, DType dtype, const void* x, void* y, float scale,
            float* scratch, cudaStream_t stream) {
  MIXPREC_CHECK(plan.splits == 1 || scratch != nullptr, "sum_to: the plan needs ",
                plan.scratch_floats(), " floats of scratch; pass them");
  MIXPREC_CUDA_DISPATCH_FLOATING(dtype, "sum_to", [&] {
    const scalar_t* px = static_cast<const scalar_t*>(x);
    scalar_t* py = static_cast<scalar_t*>(y);
    if (fits_32_bits(plan.x_numel)) launch_sum_to<scalar_t, uint32_t>(plan, px, py, scale, scratch, stream);
    else launch_sum_to<scalar_t, uint64_t>(plan, px, py, scale, scratch, stream);
  });
}

}  // namespace mixprec::kernels
