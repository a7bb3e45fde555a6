// Row kernels of the CUDA backend (softmax, cross-entropy, layer norm): a group of threads
// per row of `cols` contiguous values, the walk over its elements and the group's
// reductions. Included only by cuda/kernels/*.cu.
//
// A row of up to kWarpRowMax columns is owned by one warp (8 rows per 256-thread block);
// a longer row by a whole block. The choice depends on the shape alone, and so does every
// summation order: each thread accumulates its elements in index order, the warp combines
// its lanes by an xor butterfly and the block combines its warps in warp order. The same
// inputs therefore give the same bits on every run, and every thread of the group ends with
// the same reduced value.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "cuda/kernels/common.cuh"

namespace mixprec::kernels {

inline constexpr int64_t kWarpRowMax = 1024;

// Threads per row for rows of `cols` values.
inline int row_threads(int64_t cols) { return cols <= kWarpRowMax ? kWarp : kThreads; }

// Blocks of kThreads threads for `rows` rows owned by groups of `threads` threads.
inline unsigned row_grid(int64_t rows, int threads) {
  const int64_t per_block = kThreads / threads;
  return grid_for((rows + per_block - 1) / per_block * kThreads);
}

struct SumOp {
  template <class V>
  __device__ __forceinline__ V operator()(V a, V b) const { return a + b; }
};

struct MaxOp {
  // As softmax_max_step: fmaxf skips a NaN operand.
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// The position of the calling thread: its row slot in the block and its lane in the row.
template <int kRowThreads>
struct RowLane {
  static constexpr int kRowsPerBlock = kThreads / kRowThreads;
  int slot = static_cast<int>(threadIdx.x) / kRowThreads;
  int lane = static_cast<int>(threadIdx.x) % kRowThreads;

  // First row of this thread and the step between its rows (grid-stride over the rows).
  __device__ __forceinline__ int64_t first_row() const {
    return static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + slot;
  }
  __device__ __forceinline__ int64_t row_step() const {
    return static_cast<int64_t>(gridDim.x) * kRowsPerBlock;
  }
};

// Reduction of `value` over the kRowThreads threads of a row. Every thread of the block must
// call it the same number of times (block-wide rows synchronise); `scratch` holds
// kThreads / kWarp values per block and is reused by the next call.
template <int kRowThreads, class V, class Op>
__device__ __forceinline__ V row_reduce(V value, Op op, V* scratch) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    value = op(value, __shfl_xor_sync(0xFFFFFFFFu, value, offset));
  if constexpr (kRowThreads == kWarp) {
    return value;
  } else {
    static_assert(kRowThreads == kThreads, "a row is owned by a warp or by the block");
    const int warp = static_cast<int>(threadIdx.x) / kWarp;
    __syncthreads();  // the previous call's readers are done with scratch
    if (threadIdx.x % kWarp == 0) scratch[warp] = value;
    __syncthreads();
    V total = scratch[0];
#pragma unroll
    for (int w = 1; w < kThreads / kWarp; ++w) total = op(total, scratch[w]);
    return total;
  }
}

// Walks the columns of a row that `lane` owns, in increasing order, calling f(j, values...)
// with the FP32 values at column j of each of the N input rows. With kStore, f returns the
// output value, stored rounded once at out[j]; otherwise its result is ignored and out is
// unused. With `packed`, lanes own whole 16-byte packs (every row pointer must then be
// 16-byte aligned and cols a multiple of kVec<T>).
template <int kRowThreads, bool kStore, class T, int N, class F>
__device__ __forceinline__ void row_walk(const T* const (&rows)[N], T* out, int64_t cols,
                                         int lane, bool packed, F&& f) {
  static_assert(N == 1 || N == 2, "row_walk: one or two input rows");
  const auto apply = [&](int64_t j, const T (&v)[N]) {
    if constexpr (N == 1) return f(j, to_float(v[0]));
    else return f(j, to_float(v[0]), to_float(v[1]));
  };
  if (packed) {
    constexpr int V = kVec<T>;
    using P = Pack<T, V>;
    const int64_t packs = cols / V;
    for (int64_t p = lane; p < packs; p += kRowThreads) {
      P x[N];
#pragma unroll
      for (int k = 0; k < N; ++k) x[k] = reinterpret_cast<const P*>(rows[k])[p];
      [[maybe_unused]] P y;
#pragma unroll
      for (int i = 0; i < V; ++i) {
        T v[N];
#pragma unroll
        for (int k = 0; k < N; ++k) v[k] = x[k].v[i];
        if constexpr (kStore) y.v[i] = from_float<T>(apply(p * V + i, v));
        else apply(p * V + i, v);
      }
      if constexpr (kStore) reinterpret_cast<P*>(out)[p] = y;
    }
    return;
  }
  for (int64_t j = lane; j < cols; j += kRowThreads) {
    T v[N];
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = rows[k][j];
    if constexpr (kStore) out[j] = from_float<T>(apply(j, v));
    else apply(j, v);
  }
}

// f(j, values...) over the row's columns that `lane` owns (a reduction's accumulation).
template <int kRowThreads, class T, int N, class F>
__device__ __forceinline__ void row_visit(const T* const (&rows)[N], int64_t cols, int lane,
                                          bool packed, F&& f) {
  row_walk<kRowThreads, false>(rows, static_cast<T*>(nullptr), cols, lane, packed, f);
}

// out[j] = f(j, values...) over the row's columns that `lane` owns, rounded once on store.
template <int kRowThreads, class T, int N, class F>
__device__ __forceinline__ void row_map(const T* const (&rows)[N], T* out, int64_t cols, int lane,
                                        bool packed, F&& f) {
  row_walk<kRowThreads, true>(rows, out, cols, lane, packed, f);
}

// Whether rows of `cols` elements starting at these pointers can move in 16-byte packs.
template <class T>
bool rows_packable(int64_t cols, std::initializer_list<const void*> pointers) {
  if (cols % kVec<T> != 0) return false;
  for (const void* p : pointers)
    if (!aligned_to(p, 16)) return false;
  return true;
}

// Launches kernel<kRowThreads> for `rows` rows of `cols` columns with the group size that
// row_threads picks; `launch` is called with std::integral_constant<int, kRowThreads>.
template <class Launch>
void with_row_threads(int64_t cols, const Launch& launch) {
  if (row_threads(cols) == kWarp) launch(std::integral_constant<int, kWarp>{});
  else launch(std::integral_constant<int, kThreads>{});
}

}  // namespace mixprec::kernels
