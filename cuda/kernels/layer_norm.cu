#include "cuda/kernels/layer_norm.h"

#include <algorithm>

#include "core/math/norm.h"
#include "cuda/kernels/rows.cuh"
#include "cuda/kernels/split_totals.cuh"

namespace mixprec::kernels {
namespace {

// Column tile of the weight and bias gradients: a warp reads 32 consecutive columns of a
// row, and the block's kRowLanes warps read different rows.
constexpr int kTileColumns = 32;
constexpr int kRowLanes = kThreads / kTileColumns;
// Rows per split at least, and at most this many splits.
constexpr int64_t kMinSplitRows = 64;
constexpr int64_t kMaxSplits = 1024;

struct Splits {
  int64_t count, rows_each;
};

Splits column_splits(int64_t rows) {
  const int64_t each = std::max(kMinSplitRows, (rows + kMaxSplits - 1) / kMaxSplits);
  return {std::max<int64_t>(1, (rows + each - 1) / each), each};
}

template <class T>
__device__ __forceinline__ float load_or(const T* p, int64_t j, float fallback) {
  return p != nullptr ? to_float(p[j]) : fallback;
}

template <int R, class T>
__global__ void __launch_bounds__(kThreads) layer_norm_kernel(const T* x, const T* w, const T* b,
                                                             float eps, T* y, float* mean,
                                                             float* rstd, int64_t rows,
                                                             int64_t cols, bool packed) {
  __shared__ float scratch[kThreads / kWarp];
  const RowLane<R> at;
  const float n = static_cast<float>(cols);
  for (int64_t r = at.first_row(); r < rows; r += at.row_step()) {
    const T* in[1] = {x + r * cols};
    float sum = 0.0f;
    row_visit<R>(in, cols, at.lane, packed, [&](int64_t, float v) { sum += v; });
    const float m = norm_mean(row_reduce<R>(sum, SumOp{}, scratch), n);
    float sq = 0.0f;
    row_visit<R>(in, cols, at.lane, packed, [&](int64_t, float v) {
      const float d = v - m;
      sq += d * d;
    });
    const float rs = norm_rstd(norm_variance(row_reduce<R>(sq, SumOp{}, scratch), n), eps);
    if (at.lane == 0) {
      mean[r] = m;
      rstd[r] = rs;
    }
    row_map<R>(in, y + r * cols, cols, at.lane, packed, [&](int64_t j, float v) {
      return norm_apply(v, m, rs, load_or(w, j, 1.0f), load_or(b, j, 0.0f));
    });
  }
}

template <int R, class T>
__global__ void __launch_bounds__(kThreads) layer_norm_dx_kernel(const T* x, const T* w,
                                                                const float* mean,
                                                                const float* rstd, const T* dy,
                                                                T* dx, int64_t rows, int64_t cols,
                                                                bool packed) {
  __shared__ float scratch[kThreads / kWarp];
  const RowLane<R> at;
  for (int64_t r = at.first_row(); r < rows; r += at.row_step()) {
    const T* in[2] = {x + r * cols, dy + r * cols};
    const float m = mean[r], rs = rstd[r];
    float sum_g = 0.0f, sum_g_xhat = 0.0f;
    row_visit<R>(in, cols, at.lane, packed, [&](int64_t j, float xv, float d) {
      const float g = d * load_or(w, j, 1.0f);
      sum_g += g;
      sum_g_xhat += layer_norm_grad_xhat(g, xv, m, rs);
    });
    sum_g = row_reduce<R>(sum_g, SumOp{}, scratch);
    sum_g_xhat = row_reduce<R>(sum_g_xhat, SumOp{}, scratch);
    const NormBackwardMeans means =
        norm_backward_means(sum_g, sum_g_xhat, static_cast<float>(cols), true);
    row_map<R>(in, dx + r * cols, cols, at.lane, packed, [&](int64_t j, float xv, float d) {
      const float g = d * load_or(w, j, 1.0f);
      return norm_backward_value(g, norm_xhat(xv, m, rs), means.g, means.g_xhat, rs);
    });
  }
}

// Block (tile, split): lane (column, row lane) sums dy * xhat and dy over every kRowLanes-th
// row of the split, and row lane 0 adds the lanes in order. With one split the sums are
// stored rounded; otherwise they go to partial[split] (weight sums, then bias sums).
template <class T>
__global__ void __launch_bounds__(kThreads) layer_norm_params_kernel(
    const T* x, const float* mean, const float* rstd, const T* dy, int64_t rows, int64_t cols,
    int64_t split_rows, T* dw, T* db, float* partial) {
  __shared__ float sw[kRowLanes][kTileColumns];
  __shared__ float sb[kRowLanes][kTileColumns];
  const int tx = static_cast<int>(threadIdx.x) % kTileColumns;
  const int ty = static_cast<int>(threadIdx.x) / kTileColumns;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kTileColumns + tx;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * split_rows;
  const int64_t end = begin + split_rows < rows ? begin + split_rows : rows;
  float acc_w = 0.0f, acc_b = 0.0f;
  if (col < cols) {
    for (int64_t r = begin + ty; r < end; r += kRowLanes) {
      const float d = to_float(dy[r * cols + col]);
      acc_w += layer_norm_grad_xhat(d, to_float(x[r * cols + col]), mean[r], rstd[r]);
      acc_b += d;
    }
  }
  sw[ty][tx] = acc_w;
  sb[ty][tx] = acc_b;
  __syncthreads();
  if (ty != 0 || col >= cols) return;
  float total_w = sw[0][tx], total_b = sb[0][tx];
#pragma unroll
  for (int k = 1; k < kRowLanes; ++k) {
    total_w += sw[k][tx];
    total_b += sb[k][tx];
  }
  if (partial == nullptr) {
    if (dw != nullptr) dw[col] = from_float<T>(total_w);
    if (db != nullptr) db[col] = from_float<T>(total_b);
    return;
  }
  float* pw = partial + static_cast<int64_t>(blockIdx.y) * 2 * cols;
  pw[col] = total_w;
  pw[cols + col] = total_b;
}

// Per weight and per bias column (j < cols and j >= cols of a partial row): the splits'
// partial sums added by a warp (warp_split_total), rounded once.
template <class T>
__global__ void __launch_bounds__(kThreads) layer_norm_params_total_kernel(
    const float* partial, int64_t splits, int64_t cols, T* dw, T* db) {
  const int64_t width = 2 * cols;
  for (int64_t j = first_warp_output(); j < width; j += warp_output_stride()) {
    const float total = warp_split_total(partial + j, splits, width);
    T* out = j < cols ? dw : db;
    if (first_lane() && out != nullptr) out[j < cols ? j : j - cols] = from_float<T>(total);
  }
}

}  // namespace

void layer_norm(DType dtype, const void* x, const void* weight, const void* bias, float eps,
                void* y, float* mean, float* rstd, int64_t rows, int64_t cols,
                cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  MIXPREC_CUDA_DISPATCH_FLOATING(dtype, "layer_norm", [&] {
    const bool packed = rows_packable<scalar_t>(cols, {x, y});
    with_row_threads(cols, [&](auto threads) {
      constexpr int R = decltype(threads)::value;
      MIXPREC_LAUNCH(row_grid(rows, R), kThreads, stream, layer_norm_kernel<R>)(
          static_cast<const scalar_t*>(x), static_cast<const scalar_t*>(weight),
          static_cast<const scalar_t*>(bias), eps, static_cast<scalar_t*>(y), mean, rstd, rows,
          cols, packed);
      CUDA_CHECK_LAST();
    });
  });
}

size_t layer_norm_backward_scratch_floats(int64_t rows, int64_t cols) {
  const Splits s = column_splits(rows);
  return s.count > 1 ? static_cast<size_t>(s.count * 2 * cols) : 0;
}

void layer_norm_backward(DType dtype, const void* x, const void* weight, const float* mean,
                         const float* rstd, const void* dy, void* dx, void* dweight, void* dbias,
                         int64_t rows, int64_t cols, float* scratch, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  MIXPREC_CUDA_DISPATCH_FLOATING(dtype, "layer_norm_backward", [&] {
    const auto* px = static_cast<const scalar_t*>(x);
    const auto* pdy = static_cast<const scalar_t*>(dy);
    const bool packed = rows_packable<scalar_t>(cols, {x, dy, dx});
    with_row_threads(cols, [&](auto threads) {
      constexpr int R = decltype(threads)::value;
      MIXPREC_LAUNCH(row_grid(rows, R), kThreads, stream, layer_norm_dx_kernel<R>)(px,
          static_cast<const scalar_t*>(weight), mean, rstd, pdy, static_cast<scalar_t*>(dx), rows,
          cols, packed);
      CUDA_CHECK_LAST();
    });
    if (dweight == nullptr && dbias == nullptr) return;
    auto* pdw = static_cast<scalar_t*>(dweight);
    auto* pdb = static_cast<scalar_t*>(dbias);
    const Splits s = column_splits(rows);
    const dim3 grid(static_cast<unsigned>((cols + kTileColumns - 1) / kTileColumns),
                    static_cast<unsigned>(s.count));
    float* partial = s.count > 1 ? scratch : nullptr;
    MIXPREC_LAUNCH(grid, kThreads, stream, layer_norm_params_kernel)(px, mean, rstd, pdy, rows,
        cols, s.rows_each, pdw, pdb, partial);
    CUDA_CHECK_LAST();
    if (partial == nullptr) return;
    MIXPREC_LAUNCH(warp_per_output_grid(2 * cols), kThreads, stream,
                   layer_norm_params_total_kernel)(partial,
        s.count, cols, pdw, pdb);
    CUDA_CHECK_LAST();
  });
}

}  // namespace mixprec::kernels
