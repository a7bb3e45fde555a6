// Adding up the partial sums of a split reduction, one warp per output. A thread per output
// left the device all but idle where there are few outputs and many splits (a layer norm's
// 384 weight gradients over 256 splits ran on two blocks, each thread adding 512 partials one
// after another); a warp per output spreads the same sums over 32 times the threads, each
// adding every 32nd partial. Included only by cuda/kernels/*.cu.
#pragma once

#include <cstdint>

#include "cuda/kernels/common.cuh"

namespace mixprec::kernels {

// Blocks of kThreads threads for one warp per output (grid-stride beyond kMaxBlocks).
inline unsigned warp_per_output_grid(int64_t outputs) { return grid_for(outputs * kWarp); }

// The first output of the calling thread's warp, and the step to its next one. Every lane of
// a warp gets the same values, so a warp runs its loop as one.
__device__ __forceinline__ int64_t first_warp_output() { return first_thread() / kWarp; }
__device__ __forceinline__ int64_t warp_output_stride() { return thread_stride() / kWarp; }
__device__ __forceinline__ bool first_lane() { return threadIdx.x % kWarp == 0; }

// The sum over s in [0, splits) of partial[s * split_stride], computed by the calling warp:
// lane l adds s = l, l + 32, ... in increasing order, then the lanes are combined by a
// butterfly whose order depends only on the lane indices. Every lane returns the same bits
// (each pair adds the same two values), and so does every run. All 32 lanes must call it.
template <class V>
__device__ __forceinline__ V warp_split_total(const V* partial, int64_t splits,
                                              int64_t split_stride) {
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  V total = 0;
  for (int64_t s = lane; s < splits; s += kWarp) total += partial[s * split_stride];
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    total += __shfl_xor_sync(0xFFFFFFFFu, total, offset);
  }
  return total;
}

}  // namespace mixprec::kernels
