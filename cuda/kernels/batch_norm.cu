#include "cuda/kernels/batch_norm.h"

#include <algorithm>

#include "core/math/elementwise.h"
#include "core/math/norm.h"
#include "cuda/kernels/common.cuh"
#include "cuda/kernels/split_totals.cuh"

namespace mixprec::kernels {
namespace {

// Values of one channel per split, and the most splits a channel is cut into: enough blocks
// to fill a large GPU for the small channel counts of the first layers, few enough that the
// serial sum of the partials stays short.
constexpr int64_t kValuesPerSplit = 4096;
constexpr int64_t kMaxSplits = 256;

// How the per-channel reductions are cut: block b of channels * splits blocks sums the values
// [k * per_split, min((k + 1) * per_split, values)) of channel b / splits, k = b % splits.
struct ChannelGrid {
  int64_t channels, inner, values, splits, per_split;
};

ChannelGrid channel_grid(const BatchNormLayout& l) {
  const int64_t values = l.count();
  const int64_t splits = std::clamp<int64_t>((values + kValuesPerSplit - 1) / kValuesPerSplit, 1,
                                             kMaxSplits);
  return {l.c, l.inner, values, splits, (values + splits - 1) / splits};
}

// The scratch: two double partials per (channel, split), the double mean per channel, then
// three floats per channel (the backward's two means and its scale).
struct ScratchParts {
  double* partial0;
  double* partial1;
  double* mean;
  float* coefficients;
};

ScratchParts scratch_parts(const ChannelGrid& g, void* scratch) {
  const int64_t pairs = g.channels * g.splits;
  double* base = static_cast<double*>(scratch);
  return {base, base + pairs, base + 2 * pairs, reinterpret_cast<float*>(base + 2 * pairs + g.channels)};
}

struct SplitRange {
  int64_t c, k, begin, end;
};

__device__ __forceinline__ SplitRange split_range(const ChannelGrid& g) {
  const int64_t c = blockIdx.x / g.splits;
  const int64_t k = blockIdx.x - c * g.splits;
  const int64_t begin = k * g.per_split;
  const int64_t end = begin + g.per_split < g.values ? begin + g.per_split : g.values;
  return {c, k, begin, end};
}

// Calls f(offset) for the values of the block's split, each thread taking every kThreads-th
// in increasing order. The (sample, position) pair advances by additions only.
template <class F>
__device__ __forceinline__ void walk_split(const ChannelGrid& g, const SplitRange& r, const F& f) {
  int64_t j = r.begin + threadIdx.x;
  if (j >= r.end) return;
  int64_t s = j / g.inner;
  int64_t i = j - s * g.inner;
  const int64_t step_s = kThreads / g.inner;
  const int64_t step_i = kThreads - step_s * g.inner;  // < inner, so one carry at most
  for (; j < r.end; j += kThreads) {
    f((s * g.channels + r.c) * g.inner + i);
    i += step_i;
    s += step_s;
    if (i >= g.inner) {
      i -= g.inner;
      ++s;
    }
  }
}

// Sums a and b over the block by a fixed shared-memory tree; valid in thread 0.
__device__ __forceinline__ void block_sum2(double& a, double& b) {
  __shared__ double sa[kThreads];
  __shared__ double sb[kThreads];
  const int t = threadIdx.x;
  sa[t] = a;
  sb[t] = b;
  __syncthreads();
#pragma unroll
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (t < width) {
      sa[t] += sa[t + width];
      sb[t] += sb[t + width];
    }
    __syncthreads();
  }
  a = sa[0];
  b = sb[0];
}

// Sum of channel c's partials, added by the calling warp (warp_split_total): every lane of
// the warp must call it, and every lane gets the total.
__device__ __forceinline__ double channel_total(const double* partial, const ChannelGrid& g,
                                                int64_t c) {
  return warp_split_total(partial + c * g.splits, g.splits, 1);
}

// ---- forward ------------------------------------------------------------------------------

template <class T>
__global__ void __launch_bounds__(kThreads) sum_kernel(const T* x, ChannelGrid g, double* partial) {
  const SplitRange r = split_range(g);
  double sum = 0.0, unused = 0.0;
  walk_split(g, r, [&](int64_t o) { sum += to_float(x[o]); });
  block_sum2(sum, unused);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// Each block first finds its channel's mean from sum_kernel's partials: the block's first warp
// adds them (channel_total), in the same order in every block of the channel, so all get the
// same bits, and the channel's first block stores it for training_stats_kernel. (A kernel of
// its own for the means cost a launch per batch norm.)
template <class T>
__global__ void __launch_bounds__(kThreads) squared_deviation_kernel(const T* x, ChannelGrid g,
                                                                    const double* sums,
                                                                    double* mean,
                                                                    double* partial) {
  const SplitRange r = split_range(g);
  __shared__ double channel_mean;
  if (threadIdx.x < kWarp) {
    const double total = channel_total(sums, g, r.c);
    if (threadIdx.x == 0) channel_mean = norm_mean(total, static_cast<double>(g.values));
  }
  __syncthreads();
  const double m = channel_mean;
  if (r.k == 0 && threadIdx.x == 0) mean[r.c] = m;
  double sum = 0.0, unused = 0.0;
  walk_split(g, r, [&](int64_t o) {
    const double d = to_float(x[o]) - m;
    sum += d * d;
  });
  block_sum2(sum, unused);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// The per-channel kernels below run a warp per channel (warp_per_output_grid).
__global__ void training_stats_kernel(const double* partial, const double* mean, ChannelGrid g,
                                      float momentum, float eps, float* running_mean,
                                      float* running_var, float* save_mean, float* save_invstd) {
  const double count = static_cast<double>(g.values);
  for (int64_t c = first_warp_output(); c < g.channels; c += warp_output_stride()) {
    const double total = channel_total(partial, g, c);
    if (!first_lane()) continue;
    const float var = static_cast<float>(norm_variance(total, count));
    const float m = static_cast<float>(mean[c]);
    save_mean[c] = m;
    save_invstd[c] = norm_rstd(var, eps);
    running_mean[c] = running_stat_update(running_mean[c], m, momentum);
    running_var[c] = running_stat_update(running_var[c], unbiased_variance(var, count), momentum);
  }
}

__global__ void eval_stats_kernel(const float* running_mean, const float* running_var,
                                  int64_t channels, float eps, float* save_mean,
                                  float* save_invstd) {
  for (int64_t c = first_thread(); c < channels; c += thread_stride()) {
    save_mean[c] = running_mean[c];
    save_invstd[c] = norm_rstd(running_var[c], eps);
  }
}

template <class T, class Index>
__global__ void __launch_bounds__(kThreads) apply_kernel(const T* x, const T* weight,
                                                        const T* bias, const float* mean,
                                                        const float* invstd, Index channels,
                                                        Index inner, Index n, bool relu, T* y) {
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index idx = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += stride) {
    const Index c = (idx / inner) % channels;
    const float v =
        norm_apply(to_float(x[idx]), mean[c], invstd[c], to_float(weight[c]), to_float(bias[c]));
    y[idx] = from_float<T>(relu ? unary_value<UnaryOp::Relu>(v) : v);
  }
}

// ---- backward -----------------------------------------------------------------------------

// dy at offset o, through the fused relu's derivative when relu_bias is non-null: at the
// batch-norm output recomputed from x and rounded to T as the forward stored it.
template <class T>
__device__ __forceinline__ float gated_dy(const T* x, const T* dy, const T* weight,
                                          const T* relu_bias, float mean, float invstd,
                                          int64_t c, int64_t o) {
  const float d = to_float(dy[o]);
  if (relu_bias == nullptr) return d;
  const float y = to_float(from_float<T>(
      norm_apply(to_float(x[o]), mean, invstd, to_float(weight[c]), to_float(relu_bias[c]))));
  return unary_grad<UnaryOp::Relu>(y, y, d);
}

template <class T>
__global__ void __launch_bounds__(kThreads) backward_sums_kernel(
    const T* x, const T* dy, const T* weight, const T* relu_bias, const float* save_mean,
    const float* save_invstd, ChannelGrid g, double* sum_dy, double* sum_dy_xhat) {
  const SplitRange r = split_range(g);
  const float m = save_mean[r.c], invstd = save_invstd[r.c];
  double a = 0.0, b = 0.0;
  walk_split(g, r, [&](int64_t o) {
    const float d = gated_dy(x, dy, weight, relu_bias, m, invstd, r.c, o);
    a += d;
    b += static_cast<double>(d) * norm_xhat(to_float(x[o]), m, invstd);
  });
  block_sum2(a, b);
  if (threadIdx.x == 0) {
    sum_dy[blockIdx.x] = a;
    sum_dy_xhat[blockIdx.x] = b;
  }
}

// dweight, dbias and, per channel, the two means and the scale of dx's formula.
template <class T>
__global__ void backward_coefficients_kernel(const double* sum_dy, const double* sum_dy_xhat,
                                             const T* weight, const float* save_invstd,
                                             ChannelGrid g, bool training, T* dweight, T* dbias,
                                             float* coefficients) {
  for (int64_t c = first_warp_output(); c < g.channels; c += warp_output_stride()) {
    const double a = channel_total(sum_dy, g, c);
    const double b = channel_total(sum_dy_xhat, g, c);
    if (!first_lane()) continue;
    dweight[c] = from_float<T>(static_cast<float>(b));
    dbias[c] = from_float<T>(static_cast<float>(a));
    const NormBackwardMeans means =
        norm_backward_means(a, b, static_cast<double>(g.values), training);
    coefficients[3 * c] = means.g;
    coefficients[3 * c + 1] = means.g_xhat;
    coefficients[3 * c + 2] = to_float(weight[c]) * save_invstd[c];
  }
}

template <class T, class Index>
__global__ void __launch_bounds__(kThreads) backward_apply_kernel(
    const T* x, const T* dy, const T* weight, const T* relu_bias, const float* save_mean,
    const float* save_invstd, const float* coefficients, Index channels, Index inner, Index n,
    T* dx) {
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index idx = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += stride) {
    const Index c = (idx / inner) % channels;
    const float xhat = norm_xhat(to_float(x[idx]), save_mean[c], save_invstd[c]);
    const float d = gated_dy(x, dy, weight, relu_bias, save_mean[c], save_invstd[c], c, idx);
    dx[idx] = from_float<T>(norm_backward_value(d, xhat, coefficients[3 * c],
                                                coefficients[3 * c + 1], coefficients[3 * c + 2]));
  }
}

// ---- launches -----------------------------------------------------------------------------

unsigned split_blocks(const char* op, const ChannelGrid& g) {
  const int64_t blocks = g.channels * g.splits;
  MIXPREC_CHECK(blocks <= INT32_MAX, op, ": ", g.channels, " channels are more than the CUDA "
                "backend's batch norm supports");
  return static_cast<unsigned>(blocks);
}

// Runs f with the narrowest index type that holds every element offset of the tensor.
template <class F>
void with_index_type(int64_t n, const F& f) {
  if (n < (int64_t{1} << 31)) f(uint32_t{});
  else f(uint64_t{});
}

}  // namespace

size_t batch_norm_scratch_bytes(const BatchNormLayout& layout) {
  const ChannelGrid g = channel_grid(layout);
  return static_cast<size_t>(2 * g.channels * g.splits + g.channels) * sizeof(double) +
         static_cast<size_t>(3 * g.channels) * sizeof(float);
}

void batch_norm_forward(DType dtype, const BatchNormLayout& layout, const void* x,
                        const void* weight, const void* bias, float* running_mean,
                        float* running_var, bool training, float momentum, float eps, bool relu,
                        void* y, float* save_mean, float* save_invstd, void* scratch,
                        cudaStream_t stream) {
  const ChannelGrid g = channel_grid(layout);
  const ScratchParts s = scratch_parts(g, scratch);
  const int64_t n = layout.n * layout.c * layout.inner;
  MIXPREC_CUDA_DISPATCH_FLOATING(dtype, "batch_norm", [&] {
    const auto* px = static_cast<const scalar_t*>(x);
    if (training) {
      const unsigned blocks = split_blocks("batch_norm", g);
      MIXPREC_LAUNCH(blocks, kThreads, stream, sum_kernel<scalar_t>)(px, g, s.partial0);
      CUDA_CHECK_LAST();
      MIXPREC_LAUNCH(blocks, kThreads, stream, squared_deviation_kernel<scalar_t>)(px, g,
          s.partial0, s.mean, s.partial1);
      CUDA_CHECK_LAST();
      MIXPREC_LAUNCH(warp_per_output_grid(g.channels), kThreads, stream,
                     training_stats_kernel)(s.partial1,
          s.mean, g, momentum, eps, running_mean, running_var, save_mean, save_invstd);
      CUDA_CHECK_LAST();
    } else {
      MIXPREC_LAUNCH(grid_for(g.channels), kThreads, stream, eval_stats_kernel)(running_mean,
          running_var, g.channels, eps, save_mean, save_invstd);
      CUDA_CHECK_LAST();
    }
    with_index_type(n, [&](auto index) {
      using Index = decltype(index);
      MIXPREC_LAUNCH(grid_for(n), kThreads, stream, apply_kernel<scalar_t, Index>)(px,
          static_cast<const scalar_t*>(weight), static_cast<const scalar_t*>(bias), save_mean,
          save_invstd, static_cast<Index>(layout.c), static_cast<Index>(layout.inner),
          static_cast<Index>(n), relu, static_cast<scalar_t*>(y));
      CUDA_CHECK_LAST();
    });
  });
}

void batch_norm_backward(DType dtype, const BatchNormLayout& layout, const void* x,
                         const void* weight, const float* save_mean, const float* save_invstd,
                         const void* dy, bool training, const void* relu_bias, void* dx,
                         void* dweight, void* dbias, void* scratch, cudaStream_t stream) {
  const ChannelGrid g = channel_grid(layout);
  const ScratchParts s = scratch_parts(g, scratch);
  const int64_t n = layout.n * layout.c * layout.inner;
  MIXPREC_CUDA_DISPATCH_FLOATING(dtype, "batch_norm_backward", [&] {
    const auto* px = static_cast<const scalar_t*>(x);
    const auto* pdy = static_cast<const scalar_t*>(dy);
    const auto* pw = static_cast<const scalar_t*>(weight);
    const auto* prelu = static_cast<const scalar_t*>(relu_bias);
    const unsigned blocks = split_blocks("batch_norm_backward", g);
    MIXPREC_LAUNCH(blocks, kThreads, stream, backward_sums_kernel<scalar_t>)(
        px, pdy, pw, prelu, save_mean, save_invstd, g, s.partial0, s.partial1);
    CUDA_CHECK_LAST();
    MIXPREC_LAUNCH(warp_per_output_grid(g.channels), kThreads, stream,
                   backward_coefficients_kernel<scalar_t>)(
        s.partial0, s.partial1, pw, save_invstd, g, training, static_cast<scalar_t*>(dweight),
        static_cast<scalar_t*>(dbias), s.coefficients);
    CUDA_CHECK_LAST();
    with_index_type(n, [&](auto index) {
      using Index = decltype(index);
      MIXPREC_LAUNCH(grid_for(n), kThreads, stream, backward_apply_kernel<scalar_t, Index>)(px, pdy,
          pw, prelu, save_mean, save_invstd, s.coefficients, static_cast<Index>(layout.c),
          static_cast<Index>(layout.inner), static_cast<Index>(n), static_cast<scalar_t*>(dx));
      CUDA_CHECK_LAST();
    });
  });
}

}  // namespace mixprec::kernels
