#include "cuda/kernels/softmax.h"

#include <math.h>

#include "core/math/softmax.h"
#include "cuda/kernels/rows.cuh"

namespace mixprec::kernels {
namespace {

struct RowMaxSum {
  float max;
  float sum;
};

// Shared scratch of the block-wide reductions.
struct RowScratch {
  float f[kThreads / kWarp];
  double d[kThreads / kWarp];
};

// The maximum m of a row and s = sum exp(x - m), accumulated in double and rounded once (as
// the CPU backend's reduce_row); every thread of the row's group gets both.
template <int R, class T>
__device__ __forceinline__ RowMaxSum row_max_sum(const T* x, int64_t cols, int lane, bool packed,
                                                 RowScratch& scratch) {
  const T* in[1] = {x};
  float m = -INFINITY;
  row_visit<R>(in, cols, lane, packed, [&](int64_t, float v) { m = softmax_max_step(m, v); });
  m = row_reduce<R>(m, MaxOp{}, scratch.f);
  double s = 0.0;
  row_visit<R>(in, cols, lane, packed, [&](int64_t, float v) { s += softmax_exp(v, m); });
  s = row_reduce<R>(s, SumOp{}, scratch.d);
  return {m, static_cast<float>(s)};
}

template <int R, class T>
__global__ void __launch_bounds__(kThreads) softmax_kernel(const T* x, T* y, int64_t rows,
                                                          int64_t cols, bool log, bool packed) {
  __shared__ RowScratch scratch;
  const RowLane<R> at;
  for (int64_t r = at.first_row(); r < rows; r += at.row_step()) {
    const T* in[1] = {x + r * cols};
    const RowMaxSum st = row_max_sum<R>(in[0], cols, at.lane, packed, scratch);
    T* out = y + r * cols;
    if (log) {
      const float log_sum = logf(st.sum);
      row_map<R>(in, out, cols, at.lane, packed,
                 [&](int64_t, float v) { return log_softmax_value(v, st.max, log_sum); });
    } else {
      const float inv_sum = 1.0f / st.sum;
      row_map<R>(in, out, cols, at.lane, packed,
                 [&](int64_t, float v) { return softmax_value(v, st.max, inv_sum); });
    }
  }
}

template <int R, class T>
__global__ void __launch_bounds__(kThreads) softmax_backward_kernel(const T* y, const T* dy, T* dx,
                                                                   int64_t rows, int64_t cols,
                                                                   bool log, bool packed) {
  __shared__ RowScratch scratch;
  const RowLane<R> at;
  for (int64_t r = at.first_row(); r < rows; r += at.row_step()) {
    const T* in[2] = {y + r * cols, dy + r * cols};
    double dot = 0.0;
    row_visit<R>(in, cols, at.lane, packed,
                 [&](int64_t, float yv, float g) { dot += softmax_backward_term(yv, g, log); });
    const float row_dot = static_cast<float>(row_reduce<R>(dot, SumOp{}, scratch.d));
    row_map<R>(in, dx + r * cols, cols, at.lane, packed, [&](int64_t, float yv, float g) {
      return softmax_backward_value(yv, g, row_dot, log);
    });
  }
}

// Row statistics and the per-row loss (in double) of cross-entropy.
template <int R, class T>
__global__ void __launch_bounds__(kThreads) cross_entropy_rows_kernel(
    const T* logits, const int32_t* labels, int64_t rows, int64_t cols, bool packed,
    float* row_stats, double* row_loss) {
  __shared__ RowScratch scratch;
  const RowLane<R> at;
  for (int64_t r = at.first_row(); r < rows; r += at.row_step()) {
    const T* xr = logits + r * cols;
    const RowMaxSum st = row_max_sum<R>(xr, cols, at.lane, packed, scratch);
    if (at.lane == 0) {
      const float log_sum = logf(st.sum);
      row_stats[2 * r] = st.max;
      row_stats[2 * r + 1] = log_sum;
      row_loss[r] = cross_entropy_row_loss(st.max, log_sum, to_float(xr[labels[r]]));
    }
  }
}

// One block: the row losses summed in double in an order fixed by `rows`, then the mean.
__global__ void __launch_bounds__(kThreads) cross_entropy_mean_kernel(const double* row_loss,
                                                                     int64_t rows, float* loss) {
  __shared__ double scratch[kThreads / kWarp];
  double acc = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += kThreads) acc += row_loss[r];
  const double total = row_reduce<kThreads>(acc, SumOp{}, scratch);
  if (threadIdx.x == 0) loss[0] = cross_entropy_mean(total, rows);
}

template <int R, class T>
__global__ void __launch_bounds__(kThreads) cross_entropy_backward_kernel(
    const T* logits, const int32_t* labels, const float* row_stats, const float* dloss,
    T* dlogits, int64_t rows, int64_t cols, bool packed) {
  const float scale = cross_entropy_grad_scale(*dloss, rows);
  const RowLane<R> at;
  for (int64_t r = at.first_row(); r < rows; r += at.row_step()) {
    const T* in[1] = {logits + r * cols};
    const float row_max = row_stats[2 * r], log_sum = row_stats[2 * r + 1];
    const int64_t label = labels[r];
    row_map<R>(in, dlogits + r * cols, cols, at.lane, packed, [&](int64_t j, float v) {
      return cross_entropy_grad_value(v, row_max, log_sum, j == label, scale);
    });
  }
}

}  // namespace

void softmax(DType dtype, const void* x, void* y, int64_t rows, int64_t cols, bool log,
             cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  MIXPREC_CUDA_DISPATCH_FLOATING(dtype, "softmax", [&] {
    const bool packed = rows_packable<scalar_t>(cols, {x, y});
    with_row_threads(cols, [&](auto threads) {
      constexpr int R = decltype(threads)::value;
      MIXPREC_LAUNCH(row_grid(rows, R), kThreads, stream, softmax_kernel<R>)(
          static_cast<const scalar_t*>(x), static_cast<scalar_t*>(y), rows, cols, log, packed);
      CUDA_CHECK_LAST();
    });
  });
}

void softmax_backward(DType dtype, const void* y, const void* dy, void* dx, int64_t rows,
                      int64_t cols, bool log, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  MIXPREC_CUDA_DISPATCH_FLOATING(dtype, "softmax_backward", [&] {
    const bool packed = rows_packable<scalar_t>(cols, {y, dy, dx});
    with_row_threads(cols, [&](auto threads) {
      constexpr int R = decltype(threads)::value;
      MIXPREC_LAUNCH(row_grid(rows, R), kThreads, stream, softmax_backward_kernel<R>)(
          static_cast<const scalar_t*>(y), static_cast<const scalar_t*>(dy),
          static_cast<scalar_t*>(dx), rows, cols, log, packed);
      CUDA_CHECK_LAST();
    });
  });
}

void cross_entropy(DType dtype, const void* logits, const int32_t* labels, int64_t rows,
                   int64_t cols, float* loss, float* row_stats, double* scratch,
                   cudaStream_t stream) {
  MIXPREC_CUDA_DISPATCH_FLOATING(dtype, "cross_entropy", [&] {
    if (rows > 0) {
      const bool packed = rows_packable<scalar_t>(cols, {logits});
      with_row_threads(cols, [&](auto threads) {
        constexpr int R = decltype(threads)::value;
        MIXPREC_LAUNCH(row_grid(rows, R), kThreads, stream, cross_entropy_rows_kernel<R>)(
            static_cast<const scalar_t*>(logits), labels, rows, cols, packed, row_stats, scratch);
        CUDA_CHECK_LAST();
      });
    }
  });
  // With no rows the mean is 0 / 0, a NaN, as on the CPU.
  MIXPREC_LAUNCH(1, kThreads, stream, cross_entropy_mean_kernel)(scratch, rows, loss);
  CUDA_CHECK_LAST();
}

void cross_entropy_backward(DType dtype, const void* logits, const int32_t* labels,
                            const float* row_stats, const float* dloss, void* dlogits,
                            int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  MIXPREC_CUDA_DISPATCH_FLOATING(dtype, "cross_entropy_backward", [&] {
    const bool packed = rows_packable<scalar_t>(cols, {logits, dlogits});
    with_row_threads(cols, [&](auto threads) {
      constexpr int R = decltype(threads)::value;
      MIXPREC_LAUNCH(row_grid(rows, R), kThreads, stream, cross_entropy_backward_kernel<R>)(
          static_cast<const scalar_t*>(logits), labels, row_stats, dloss,
          static_cast<scalar_t*>(dlogits), rows, cols, packed);
      CUDA_CHECK_LAST();
    });
  });
}

}  // namespace mixprec::kernels
