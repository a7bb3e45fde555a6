// Elementwise maps, broadcasting and broadcast-reductions of the CPU backend. The per-element
// math is in core/math/elementwise.h (shared with the CUDA backend); this file adds loops.
//
// Broadcasting is planned once per call (core/math/broadcast.h, the CUDA backend's plan too):
// extent-1 output dims are dropped and adjacent dims that every operand walks in step are
// merged, so the common cases (equal shapes, a bias over the last dims, a [N, 1] column)
// become one or two dims whose innermost run is contiguous or constant. A single-element
// operand of binary is read once as a constant. Work is split into fixed-size chunks of the
// output, so the parallel split (and hence every result) does not depend on the thread count.
//
// F16/BF16 data moves through FP32 scratch blocks (core/cpu/blocks.h), so the math loops run
// on floats and vectorise; F32 data is read and written in place.
#include <algorithm>
#include <array>
#include <utility>
#include <vector>

#include "core/backend_checks.h"
#include "core/cpu/blocks.h"
#include "core/cpu/common.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/dispatch.h"
#include "core/cpu/strided.h"
#include "core/error.h"
#include "core/math/broadcast.h"
#include "core/math/elementwise.h"
#include "core/op_dispatch.h"
#include "core/tensor.h"

namespace mixprec {
namespace {

using cpu::f32_target;
using cpu::kParallelWork;
using cpu::load_f32;
using cpu::store_f32;

// Output elements per parallel task of the broadcast walker.
constexpr int64_t kChunk = 1 << 14;
// Columns per task when sum_to keeps the innermost dim: 1 KiB of FP32 accumulators.
constexpr int64_t kColumnBlock = 256;
// Elements per parallel partial sum of a full reduction; partials are then added in order.
constexpr int64_t kReduceChunk = 1 << 13;
// Elements (or reduced rows) per partial sum inside one accumulation; see sum_run.
constexpr int64_t kRunBlock = 256;
// Elements per FP32 scratch block of a 16-bit operand.
constexpr int64_t kBlock = 512;

template <class T>
const T* cdata(const Tensor& t) {
  return static_cast<const T*>(t.data());
}
template <class T>
T* mdata(Tensor& t) {
  return static_cast<T*>(t.data());
}

template <size_t N, class F, size_t... I>
void apply_block(const std::array<const float*, N>& in, float* out, int64_t n, const F& f,
                 std::index_sequence<I...>) {
  for (int64_t i = 0; i < n; ++i) out[i] = f(in[I][i]...);
}

// out[i] = f(in[0][i], ..., in[N-1][i]) over n contiguous elements. Each block of the inputs
// is loaded before its outputs are stored, so out may alias an input.
template <class T, size_t N, class F>
void map_contiguous(const std::array<const T*, N>& in, T* out, int64_t n, const F& f) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n > kParallelWork)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t begin = blk * kBlock, len = std::min(kBlock, n - begin);
    float in_buf[N][kBlock];
    float out_buf[kBlock];
    std::array<const float*, N> p;
    for (size_t k = 0; k < N; ++k) p[k] = load_f32(in[k] + begin, in_buf[k], len);
    float* o = f32_target(out + begin, out_buf);
    apply_block(p, o, len, f, std::make_index_sequence<N>{});
    store_f32(o, out + begin, len);
  }
}

// Serial form of map_contiguous for one run inside an already parallel loop; an input with
// `step[k]` false is the single value at in[k] repeated.
template <class T, size_t N, class F>
void map_run(const std::array<const T*, N>& in, const std::array<bool, N>& step, T* out,
             int64_t n, const F& f) {
  float in_buf[N][kBlock];
  float out_buf[kBlock];
  std::array<const float*, N> p;
  for (size_t k = 0; k < N; ++k)
    if (!step[k]) {
      std::fill(in_buf[k], in_buf[k] + std::min(n, kBlock), to_float(*in[k]));
      p[k] = in_buf[k];
    }
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t len = std::min(kBlock, n - begin);
    for (size_t k = 0; k < N; ++k)
      if (step[k]) p[k] = load_f32(in[k] + begin, in_buf[k], len);
    float* o = f32_target(out + begin, out_buf);
    apply_block(p, o, len, f, std::make_index_sequence<N>{});
    store_f32(o, out + begin, len);
  }
}

// Calls run(out_offset, in_offsets, length) for maximal runs of consecutive output elements
// along the innermost planned dim; within a run input k advances by its innermost stride
// (1, or 0 when broadcast there).
template <int N, class Run>
void for_each_run(const BroadcastPlan<N>& plan, int64_t numel, const Run& run) {
  const int64_t ndim = static_cast<int64_t>(plan.extents.size());
  const int64_t inner = plan.extents.back();
  const int64_t chunks = (numel + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t pos = c * kChunk;
    const int64_t end = std::min(numel, pos + kChunk);
    std::vector<int64_t> index(ndim);
    std::array<int64_t, N> offsets{};
    int64_t rest = pos;
    for (int64_t d = ndim - 1; d >= 0; --d) {
      index[d] = rest % plan.extents[d];
      rest /= plan.extents[d];
      for (int k = 0; k < N; ++k) offsets[k] += index[d] * plan.strides[k][d];
    }
    while (pos < end) {
      const int64_t len = std::min(inner - index[ndim - 1], end - pos);
      run(pos, offsets, len);
      pos += len;
      index[ndim - 1] += len;
      for (int k = 0; k < N; ++k) offsets[k] += len * plan.strides[k][ndim - 1];
      // Odometer carry into the outer dims.
      for (int64_t d = ndim - 1; d > 0 && index[d] == plan.extents[d]; --d) {
        index[d] = 0;
        ++index[d - 1];
        for (int k = 0; k < N; ++k)
          offsets[k] += plan.strides[k][d - 1] - plan.extents[d] * plan.strides[k][d];
      }
    }
  }
}

template <UnaryOp Op, class T>
void unary_kernel(const T* x, T* y, int64_t n) {
  map_contiguous<T, 1>({x}, y, n, [](float v) { return unary_value<Op>(v); });
}

template <UnaryOp Op, class T>
void unary_backward_kernel(const T* x, const T* y, const T* dy, T* dx, int64_t n) {
  map_contiguous<T, 3>({x, y, dy}, dx, n,
                       [](float xv, float yv, float g) { return unary_grad<Op>(xv, yv, g); });
}

template <class T>
void affine_kernel(const T* x, float alpha, float beta, T* y, int64_t n) {
  map_contiguous<T, 1>({x}, y, n, [=](float v) { return affine_value(v, alpha, beta); });
}

template <BinaryOp Op, class T>
void binary_same_shape(const T* a, const T* b, T* out, int64_t n) {
  map_contiguous<T, 2>({a, b}, out, n, [](float u, float v) { return binary_value<Op>(u, v); });
}

// One operand has out's shape, the other is a single value `s` (a 0-d or one-element tensor,
// e.g. a loss scale), loaded once: on the right, out = op(x, s); on the left, out = op(s, x).
// It then runs as a same-shape map with blocked conversions, not element by element.
template <BinaryOp Op, bool kScalarRight, class T>
void binary_scalar(const T* x, float s, T* out, int64_t n) {
  map_contiguous<T, 1>({x}, out, n, [s](float v) {
    if constexpr (kScalarRight) return binary_value<Op>(v, s);
    else return binary_value<Op>(s, v);
  });
}

// a has out's shape; b is repeated every `nb` elements (a bias over the trailing dims).
template <BinaryOp Op, class T>
void binary_trailing(const T* a, const T* b, T* out, int64_t n, int64_t nb) {
  const auto f = [](float u, float v) { return binary_value<Op>(u, v); };
  if (nb >= kBlock) {
    const int64_t rows = n / nb;
#pragma omp parallel for schedule(static) if (n > kParallelWork)
    for (int64_t r = 0; r < rows; ++r)
      map_run<T, 2>({a + r * nb, b}, {true, true}, out + r * nb, nb, f);
    return;
  }
  // A short b is tiled into one block of whole repeats, so each block is a single map over
  // contiguous memory rather than n / nb runs of a few elements each.
  const int64_t chunk = kBlock / nb * nb;
  float tiled[kBlock];
  for (int64_t i = 0; i < chunk; ++i) tiled[i] = to_float(b[i % nb]);
  const int64_t chunks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (n > kParallelWork)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * chunk, len = std::min(chunk, n - begin);
    float in_buf[kBlock];
    float out_buf[kBlock];
    const float* pa = load_f32(a + begin, in_buf, len);
    float* o = f32_target(out + begin, out_buf);
    for (int64_t i = 0; i < len; ++i) o[i] = f(pa[i], tiled[i]);
    store_f32(o, out + begin, len);
  }
}

template <BinaryOp Op, class T>
void binary_broadcast(const T* a, const T* b, T* out, const Shape& sa, const Shape& sb,
                      const Shape& so, int64_t n) {
  const BroadcastPlan<2> plan = plan_broadcast<2>(so, {&sa, &sb});
  const std::array<bool, 2> step = {plan.strides[0].back() != 0, plan.strides[1].back() != 0};
  const auto f = [](float u, float v) { return binary_value<Op>(u, v); };
  for_each_run(plan, n, [&](int64_t o, const std::array<int64_t, 2>& off, int64_t len) {
    map_run<T, 2>({a + off[0], b + off[1]}, step, out + o, len, f);
  });
}

// Number of elements that `b` repeats with when it broadcasts to `out` as a block of out's
// trailing dims (leading 1s of b ignored), or 0 when it does not.
int64_t trailing_block(const Shape& b, const Shape& out) {
  size_t first = 0;
  while (first < b.size() && b[first] == 1) ++first;
  const size_t len = b.size() - first;
  if (len > out.size()) return 0;
  int64_t block = 1;
  for (size_t i = 0; i < len; ++i) {
    if (b[first + i] != out[out.size() - len + i]) return 0;
    block *= b[first + i];
  }
  return block;
}

template <class T>
void scale_copy(const T* x, T* y, int64_t n, float scale) {
  map_contiguous<T, 1>({x}, y, n, [=](float v) { return scale * v; });
}

// Sum of a contiguous run in FP32. Eight interleaved accumulators (which the compiler can
// keep in one vector register) over blocks of kRunBlock, blocks added in order: the rounding
// error then grows with kRunBlock / 8 + n / kRunBlock rather than with n, and the order is
// fixed, so results do not depend on the thread count.
template <class T>
float sum_run(const T* p, int64_t n) {
  constexpr int kLanes = 8;
  float buf[kRunBlock];
  float total = 0.0f;
  for (int64_t begin = 0; begin < n; begin += kRunBlock) {
    const int64_t len = std::min(kRunBlock, n - begin);
    const float* v = load_f32(p + begin, buf, len);
    float lane[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= len; i += kLanes)
      for (int j = 0; j < kLanes; ++j) lane[j] += v[i + j];
    float block = 0.0f;
    for (; i < len; ++i) block += v[i];
    for (int j = 0; j < kLanes; ++j) block += lane[j];
    total += block;
  }
  return total;
}

// Sum of all n elements: fixed-size chunks summed in parallel, partials added in order.
template <class T>
float sum_all(const T* x, int64_t n) {
  const int64_t chunks = (n + kReduceChunk - 1) / kReduceChunk;
  std::vector<float> partial(chunks);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kReduceChunk;
    partial[c] = sum_run(x + begin, std::min(kReduceChunk, n - begin));
  }
  float total = 0.0f;
  for (float p : partial) total += p;
  return total;
}

template <class T>
void sum_to_kernel(const T* x, T* y, const Shape& sx, const Shape& sy, float scale) {
  const int64_t n = shape_numel(sx), m = shape_numel(sy);
  if (n == m) return scale_copy(x, y, n, scale);
  if (m == 1) {
    y[0] = from_float<T>(scale * sum_all(x, n));
    return;
  }
  // The innermost dim is walked by the loops below, the others by offsets.
  SumToDims dims = split_sum_to(sx, sy);
  dims.drop_inner();
  const std::vector<int64_t>& kept_ext = dims.kept_extents;
  const std::vector<int64_t>& kept_xstride = dims.kept_strides;
  const std::vector<int64_t>& red_ext = dims.reduced_extents;
  const std::vector<int64_t>& red_xstride = dims.reduced_strides;
  const int64_t reduced = shape_numel(red_ext);
  const int64_t inner = dims.inner;

  if (dims.inner_reduced) {
    // The innermost dim is reduced: each y element sums `reduced` contiguous runs of `inner`.
#pragma omp parallel for if (n > kParallelWork)
    for (int64_t o = 0; o < m; ++o) {
      const int64_t base = cpu::offset_of(o, kept_ext, kept_xstride);
      float acc = 0.0f;
      for (int64_t r = 0; r < reduced; ++r)
        acc += sum_run(x + base + cpu::offset_of(r, red_ext, red_xstride), inner);
      y[o] = from_float<T>(scale * acc);
    }
    return;
  }

  // The innermost dim is kept: y is [m / inner, inner]; each task accumulates one block of
  // columns of one y row over every reduced position, reading x rows contiguously.
  const int64_t rows = m / inner;
  const int64_t blocks = (inner + kColumnBlock - 1) / kColumnBlock;
  const int64_t tasks = rows * blocks;
#pragma omp parallel for if (n > kParallelWork && tasks > 1)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t row = t / blocks;
    const int64_t col = (t % blocks) * kColumnBlock;
    const int64_t width = std::min(kColumnBlock, inner - col);
    const int64_t base = cpu::offset_of(row, kept_ext, kept_xstride) + col;
    // Partial sums over kRunBlock reduced rows are added into the totals, which bounds the
    // rounding error growth as in sum_run.
    float total[kColumnBlock] = {};
    float acc[kColumnBlock];
    float buf[kColumnBlock];
    for (int64_t r0 = 0; r0 < reduced; r0 += kRunBlock) {
      std::fill(acc, acc + width, 0.0f);
      const int64_t r1 = std::min(reduced, r0 + kRunBlock);
      for (int64_t r = r0; r < r1; ++r) {
        const float* v = load_f32(x + base + cpu::offset_of(r, red_ext, red_xstride), buf, width);
        for (int64_t j = 0; j < width; ++j) acc[j] += v[j];
      }
      for (int64_t j = 0; j < width; ++j) total[j] += acc[j];
    }
    for (int64_t j = 0; j < width; ++j) total[j] *= scale;
    store_f32(total, y + row * inner + col, width);
  }
}

template <class T>
void expand_kernel(const T* x, T* y, const Shape& sx, const Shape& sy, float scale) {
  const int64_t n = shape_numel(sy);
  if (shape_numel(sx) == n) return scale_copy(x, y, n, scale);
  const BroadcastPlan<1> plan = plan_broadcast<1>(sy, {&sx});
  const bool step = plan.strides[0].back() != 0;
  for_each_run(plan, n, [&](int64_t o, const std::array<int64_t, 1>& off, int64_t len) {
    if (step) {
      map_run<T, 1>({x + off[0]}, {true}, y + o, len, [=](float v) { return scale * v; });
    } else {
      std::fill(y + o, y + o + len, from_float<T>(scale * to_float(x[off[0]])));
    }
  });
}

template <class T>
void causal_mask_kernel(const T* x, T* y, int64_t batch, int64_t rows, int64_t cols,
                        float fill) {
  const T masked = from_float<T>(fill);
  const int64_t total_rows = batch * rows;
#pragma omp parallel for if (total_rows * cols > kParallelWork)
  for (int64_t r = 0; r < total_rows; ++r) {
    const int64_t i = r % rows;
    const T* px = x + r * cols;
    T* py = y + r * cols;
    const int64_t visible = std::min(cols, i + 1);
    if (px != py) std::copy(px, px + visible, py);
    std::fill(py + visible, py + cols, masked);
  }
}

}  // namespace

void CpuBackend::unary(UnaryOp op, const Tensor& x, Tensor& y) {
  backend_checks::unary(kCPU, x, y);
  const int64_t n = x.numel();
  MIXPREC_DISPATCH_FLOATING(x.dtype(), "unary", [&] {
    with_unary_op(op, [&](auto op_tag) {
      unary_kernel<decltype(op_tag)::value>(cdata<scalar_t>(x), mdata<scalar_t>(y), n);
    });
  });
}

void CpuBackend::unary_backward(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& dy,
                                Tensor& dx) {
  backend_checks::unary_backward(kCPU, x, y, dy, dx);
  const int64_t n = x.numel();
  MIXPREC_DISPATCH_FLOATING(x.dtype(), "unary_backward", [&] {
    with_unary_op(op, [&](auto op_tag) {
      unary_backward_kernel<decltype(op_tag)::value>(cdata<scalar_t>(x), cdata<scalar_t>(y),
                                                     cdata<scalar_t>(dy),
                                                     mdata<scalar_t>(dx), n);
    });
  });
}

void CpuBackend::affine(const Tensor& x, float alpha, float beta, Tensor& y) {
  backend_checks::affine(kCPU, x, y);
  MIXPREC_DISPATCH_FLOATING(x.dtype(), "affine", [&] {
    affine_kernel(cdata<scalar_t>(x), alpha, beta, mdata<scalar_t>(y), x.numel());
  });
}

void CpuBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  backend_checks::binary(kCPU, a, b, out);
  const int64_t n = out.numel();
  if (n == 0) return;
  const bool a_full = a.numel() == n, b_full = b.numel() == n;
  const bool a_scalar = a.numel() == 1 && b_full, b_scalar = b.numel() == 1 && a_full;
  const int64_t block = a_full ? trailing_block(b.shape(), out.shape()) : 0;
  MIXPREC_DISPATCH_FLOATING(out.dtype(), "binary", [&] {
    with_binary_op(op, [&](auto op_tag) {
      constexpr BinaryOp kOp = decltype(op_tag)::value;
      const scalar_t* pa = cdata<scalar_t>(a);
      const scalar_t* pb = cdata<scalar_t>(b);
      scalar_t* po = mdata<scalar_t>(out);
      if (a_full && b_full) binary_same_shape<kOp>(pa, pb, po, n);
      else if (b_scalar) binary_scalar<kOp, true>(pa, to_float(*pb), po, n);
      else if (a_scalar) binary_scalar<kOp, false>(pb, to_float(*pa), po, n);
      else if (block > 0) binary_trailing<kOp>(pa, pb, po, n, block);
      else binary_broadcast<kOp>(pa, pb, po, a.shape(), b.shape(), out.shape(), n);
    });
  });
}

void CpuBackend::sum_to(const Tensor& x, Tensor& y, float scale) {
  backend_checks::sum_to(kCPU, x, y);
  if (y.numel() == 0) return;
  if (x.numel() == 0) {
    fill(y, 0.0);
    return;
  }
  MIXPREC_DISPATCH_FLOATING(x.dtype(), "sum_to", [&] {
    sum_to_kernel(cdata<scalar_t>(x), mdata<scalar_t>(y), x.shape(), y.shape(), scale);
  });
}

void CpuBackend::expand(const Tensor& x, Tensor& y, float scale) {
  backend_checks::expand(kCPU, x, y);
  if (y.numel() == 0) return;
  MIXPREC_DISPATCH_FLOATING(x.dtype(), "expand", [&] {
    expand_kernel(cdata<scalar_t>(x), mdata<scalar_t>(y), x.shape(), y.shape(), scale);
  });
}

void CpuBackend::causal_mask(const Tensor& x, float fill, Tensor& y) {
  const backend_checks::Rows dims = backend_checks::causal_mask(kCPU, x, y);
  const int64_t rows = dims.rows, cols = dims.cols;
  if (x.numel() == 0) return;
  const int64_t batch = x.numel() / (rows * cols);
  MIXPREC_DISPATCH_FLOATING(x.dtype(), "causal_mask", [&] {
    causal_mask_kernel(cdata<scalar_t>(x), mdata<scalar_t>(y), batch, rows, cols, fill);
  });
}

}  // namespace mixprec
