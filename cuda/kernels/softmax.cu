#include "cuda/kernels/softmax.h"

#include <math.h>

#include "core/math/dropout.h"
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

// The element itself: row_max_sum's default view of a row.
struct AsIs {
  __device__ __forceinline__ float operator()(int64_t, float v) const { return v; }
};

// The maximum m of a row and s = sum exp(x - m), accumulated in double and rounded once (as
// the CPU backend's reduce_row); every thread of the row's group gets both. The row's element
// j is view(j, x[j]) (attention_softmax masks through it).
template <int R, class T, class View = AsIs>
__device__ __forceinline__ RowMaxSum row_max_sum(const T* x, int64_t cols, int lane, bool packed,
                                                 RowScratch& scratch, View view = {}) {
  const T* in[1] = {x};
  float m = -INFINITY;
  row_visit<R>(in, cols, lane, packed,
               [&](int64_t j, float v) { m = softmax_max_step(m, view(j, v)); });
  m = row_reduce<R>(m, MaxOp{}, scratch.f);
  double s = 0.0;
  row_visit<R>(in, cols, lane, packed,
               [&](int64_t j, float v) { s += softmax_exp(view(j, v), m); });
  s = row_reduce<R>(s, SumOp{}, scratch.d);
  return {m, static_cast<float>(s)};
}

// Element j of row r dropped out with `key` (core/math/dropout.h), or v itself when p == 0.
struct RowDropout {
  float p, scale;
  PhiloxKey key;
  // Whether element j of row r survives; true when p == 0. `draws` holds the thread's last
  // Philox block, so a thread that asks for consecutive elements (a 4-pack) evaluates Philox
  // once per block of four.
  __device__ __forceinline__ bool keep(DropoutDraws& draws, int64_t r, int64_t cols,
                                       int64_t j) const {
    if (p == 0.0f) return true;
    return draws.keep(key, static_cast<uint64_t>(r * cols + j), p);
  }
  // v dropped out by a keep() decision.
  __device__ __forceinline__ float apply(float v, bool kept) const {
    return p == 0.0f ? v : dropout_value(v, kept, scale);
  }
  __device__ __forceinline__ float operator()(DropoutDraws& draws, int64_t r, int64_t cols,
                                              int64_t j, float v) const {
    return apply(v, keep(draws, r, cols, j));
  }
};

// The keep decisions of the elements one thread visits in a row, in visiting order, so that
// a second pass over the same elements in the same order reuses them instead of evaluating
// Philox again. Holds up to 32; `active` is false when the row gives a thread more (rows
// above 32 elements per thread of the group) and every decision is then made afresh.
struct KeepBits {
  bool active;
  uint32_t bits = 0;
  int next = 0;
  __device__ __forceinline__ void put(bool kept) {
    if (active) bits |= static_cast<uint32_t>(kept) << next++;
  }
  __device__ __forceinline__ bool take() { return (bits >> next++) & 1u; }
};

// Stores a row's outputs: f(j, loaded inputs...) stores column j's outputs itself, as float
// values of F32 inputs `in` read in 4-packs when `packed`, one by one otherwise. The columns
// a lane owns do not matter to the result (each is computed alone), so this walk may differ
// from the reduction's.
template <int R, int N, class F>
__device__ __forceinline__ void row_store(const float* const (&in)[N], int64_t cols, int lane,
                                          bool packed, F&& f) {
  if (packed) {
    using P = Pack<float, 4>;
    for (int64_t q = lane; q < cols / 4; q += R) {
      P x[N];
#pragma unroll
      for (int k = 0; k < N; ++k) x[k] = reinterpret_cast<const P*>(in[k])[q];
      f(q, x);
    }
    return;
  }
  for (int64_t j = lane; j < cols; j += R) {
    Pack<float, 1> x[N];
#pragma unroll
    for (int k = 0; k < N; ++k) x[k].v[0] = in[k][j];
    f(j, x);
  }
}

// Writes values[i] (FP32) of columns j0 + i, i < V, rounded once, to out (one V-pack store).
template <class T, int V>
__device__ __forceinline__ void store_pack(T* out, int64_t pack, const float (&values)[V]) {
  Pack<T, V> y;
#pragma unroll
  for (int i = 0; i < V; ++i) y.v[i] = from_float<T>(values[i]);
  reinterpret_cast<Pack<T, V>*>(out)[pack] = y;
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

// attention_softmax: row r of the launch is row r % matrix_rows of its matrix, whose columns
// right of the diagonal read as the causal mask's -inf. probs and operand are written from
// the same FP32 value, so operand may be probs itself (F32, p == 0).
template <int R, class T>
__global__ void __launch_bounds__(kThreads) attention_softmax_kernel(
    const float* scores, RowDropout drop, float* probs, T* operand, int64_t rows,
    int64_t matrix_rows, int64_t cols, bool packed, bool packed_store) {
  __shared__ RowScratch scratch;
  DropoutDraws draws;
  const RowLane<R> at;
  for (int64_t r = at.first_row(); r < rows; r += at.row_step()) {
    const int64_t diagonal = r % matrix_rows;
    const auto masked = [diagonal](int64_t j, float v) { return j > diagonal ? -INFINITY : v; };
    const float* in[1] = {scores + r * cols};
    // The reduction stops after the live columns (whole packs when packed), each thread
    // walking its columns as softmax over the whole masked row would: the columns left out
    // would add +0 to its sums (or a NaN where column 0 has made the row NaN already), so
    // the bits are the composition's (core/cpu/cpu_softmax.cpp says why in full).
    const int64_t live = diagonal + 1 < cols ? diagonal + 1 : cols;
    const int64_t reduced = packed ? (live + 3) / 4 * 4 : live;
    const RowMaxSum st = row_max_sum<R>(in[0], reduced < cols ? reduced : cols, at.lane, packed,
                                        scratch, masked);
    const float inv_sum = 1.0f / st.sum;
    float* probs_row = probs + r * cols;
    T* operand_row = operand + r * cols;
    row_store<R>(in, cols, at.lane, packed_store, [&](int64_t at_pack, const auto (&x)[1]) {
      constexpr int V = sizeof(x[0].v) / sizeof(float);
      float y[V], kept[V];
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const int64_t j = at_pack * V + i;
        y[i] = softmax_value(masked(j, x[0].v[i]), st.max, inv_sum);
        // +0 stays +0 through dropout, kept or dropped: no Philox draw for it.
        kept[i] = y[i] == 0.0f ? 0.0f : drop(draws, r, cols, j, y[i]);
      }
      store_pack<float, V>(probs_row, at_pack, y);
      store_pack<T, V>(operand_row, at_pack, kept);
    });
  }
}

// attention_softmax_backward: softmax_backward_kernel's reduction and values with dy the
// dropped-out dprobs, rounded once into ds.
template <int R, class T>
__global__ void __launch_bounds__(kThreads) attention_softmax_backward_kernel(
    const float* probs, const float* dprobs, RowDropout drop, T* ds, int64_t rows, int64_t cols,
    bool packed, bool packed_store) {
  __shared__ RowScratch scratch;
  DropoutDraws draws;
  const RowLane<R> at;
  for (int64_t r = at.first_row(); r < rows; r += at.row_step()) {
    const float* in[2] = {probs + r * cols, dprobs + r * cols};
    // Both passes walk a thread's elements in one order when both read packs or both read one
    // by one, so the second takes the first's keep decisions.
    KeepBits kept{drop.p > 0.0f && packed == packed_store && cols <= 32 * R};
    double dot = 0.0;
    row_visit<R>(in, cols, at.lane, packed, [&](int64_t j, float y, float g) {
      const bool keep = drop.keep(draws, r, cols, j);
      kept.put(keep);
      dot += softmax_backward_term(y, drop.apply(g, keep), false);
    });
    const float row_dot = static_cast<float>(row_reduce<R>(dot, SumOp{}, scratch.d));
    T* ds_row = ds + r * cols;
    kept.next = 0;
    row_store<R>(in, cols, at.lane, packed_store, [&](int64_t at_pack, const auto (&x)[2]) {
      constexpr int V = sizeof(x[0].v) / sizeof(float);
      float dx[V];
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const int64_t j = at_pack * V + i;
        const bool keep = kept.active ? kept.take() : drop.keep(draws, r, cols, j);
        dx[i] = softmax_backward_value(x[0].v[i], drop.apply(x[1].v[i], keep), row_dot, false);
      }
      store_pack<T, V>(ds_row, at_pack, dx);
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

void attention_softmax(DType dtype, const float* scores, float p, PhiloxKey key, float* probs,
                       void* operand, int64_t rows, int64_t matrix_rows, int64_t cols,
                       cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  // The dropout scale is computed once on the host, as the CPU backend does.
  const RowDropout drop{p, dropout_scale(p), key};
  // The reduction walks the row as softmax over the masked scores would (same `packed`), so
  // the sums, and so the bits, are those of the composition.
  const bool packed = rows_packable<float>(cols, {scores, probs});
  MIXPREC_CUDA_DISPATCH_FLOATING(dtype, "attention_softmax", [&] {
    const bool packed_store = packed && aligned_to(operand, 4 * sizeof(scalar_t));
    with_row_threads(cols, [&](auto threads) {
      constexpr int R = decltype(threads)::value;
      MIXPREC_LAUNCH(row_grid(rows, R), kThreads, stream, attention_softmax_kernel<R>)(
          scores, drop, probs, static_cast<scalar_t*>(operand), rows, matrix_rows, cols, packed,
          packed_store);
      CUDA_CHECK_LAST();
    });
  });
}

void attention_softmax_backward(DType dtype, const float* probs, const float* dprobs, float p,
                                PhiloxKey key, void* ds, int64_t rows, int64_t cols,
                                cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  const RowDropout drop{p, dropout_scale(p), key};
  const bool packed = rows_packable<float>(cols, {probs, dprobs});
  MIXPREC_CUDA_DISPATCH_FLOATING(dtype, "attention_softmax_backward", [&] {
    const bool packed_store = packed && aligned_to(ds, 4 * sizeof(scalar_t));
    with_row_threads(cols, [&](auto threads) {
      constexpr int R = decltype(threads)::value;
      MIXPREC_LAUNCH(row_grid(rows, R), kThreads, stream, attention_softmax_backward_kernel<R>)(
          probs, dprobs, drop, static_cast<scalar_t*>(ds), rows, cols, packed, packed_store);
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
