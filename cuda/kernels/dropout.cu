#include "cuda/kernels/dropout.h"

#include "core/math/dropout.h"
#include "cuda/kernels/common.cuh"

namespace mixprec::kernels {
namespace {

// A thread per Philox block (core/math/dropout.h): one evaluation gives the keep decisions of
// its four elements 4b .. 4b + 3, the last block holding fewer when n is not a multiple of 4.
// Loads are not packed: the kernel is bound by Philox.
// With a residual, the product is rounded to T as the separate dropout stores it, then added
// to the residual in one rounded F32 add, as binary's Add does.
template <class T>
__global__ void __launch_bounds__(kThreads) dropout_kernel(const T* x, const T* residual, float p,
                                                          float scale, PhiloxKey key, T* y,
                                                          int64_t n, int64_t blocks) {
  const int64_t stride = thread_stride();
  for (int64_t b = first_thread(); b < blocks; b += stride) {
    const Philox4 r = philox4x32(key.seed, dropout_block(key, static_cast<uint64_t>(4 * b)));
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const int64_t i = 4 * b + w;
      if (i < n) {
        const T dropped =
            from_float<T>(dropout_value(to_float(x[i]), dropout_keep_word(r.v[w], p), scale));
        y[i] = residual == nullptr ? dropped
                                   : from_float<T>(to_float(residual[i]) + to_float(dropped));
      }
    }
  }
}

}  // namespace

void dropout(DType dtype, const void* x, const void* residual, float p, PhiloxKey key, void* y,
             int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  // The scale is computed once on the host, as the CPU backend does.
  const float scale = dropout_scale(p);
  const int64_t blocks = (n + 3) / 4;
  MIXPREC_CUDA_DISPATCH_FLOATING(dtype, "dropout", [&] {
    MIXPREC_LAUNCH(grid_for(blocks), kThreads, stream, dropout_kernel)(
        static_cast<const scalar_t*>(x), static_cast<const scalar_t*>(residual), p, scale, key,
        static_cast<scalar_t*>(y), n, blocks);
    CUDA_CHECK_LAST();
  });
}

}  // namespace mixprec::kernels
