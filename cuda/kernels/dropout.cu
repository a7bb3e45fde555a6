#include "cuda/kernels/dropout.h"

#include "core/math/dropout.h"
#include "cuda/kernels/common.cuh"

namespace mixprec::kernels {
namespace {

// One Philox evaluation per element (it is compute-bound, so loads are not packed).
template <class T>
__global__ void __launch_bounds__(kThreads) dropout_kernel(const T* x, float p, float scale,
                                                          PhiloxKey key, T* y, int64_t n) {
  const int64_t stride = thread_stride();
  for (int64_t i = first_thread(); i < n; i += stride) {
    const bool keep = dropout_keep(key.seed, key.offset + static_cast<uint64_t>(i), p);
    y[i] = from_float<T>(dropout_value(to_float(x[i]), keep, scale));
  }
}

}  // namespace

void dropout(DType dtype, const void* x, float p, PhiloxKey key, void* y, int64_t n,
             cudaStream_t stream) {
  if (n <= 0) return;
  // The scale is computed once on the host, as the CPU backend does.
  const float scale = dropout_scale(p);
  MIXPREC_CUDA_DISPATCH_FLOATING(dtype, "dropout", [&] {
    MIXPREC_LAUNCH(grid_for(n), kThreads, stream, dropout_kernel)(static_cast<const scalar_t*>(x),
        p, scale, key, static_cast<scalar_t*>(y), n);
    CUDA_CHECK_LAST();
  });
}

}  // namespace mixprec::kernels
