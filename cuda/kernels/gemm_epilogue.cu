#include "cuda/kernels/gemm_epilogue.h"

#include "core/math/elementwise.h"
#include "core/op_dispatch.h"
#include "cuda/kernels/common.cuh"

namespace mixprec::kernels {
namespace {

// One thread per element, grid-stride; the column is the flat index modulo cols.
template <class T>
__global__ void __launch_bounds__(kThreads) gemm_epilogue_kernel(const float* sums, const T* bias,
                                                                T* c, T* pre_gelu, int64_t n,
                                                                int64_t cols) {
  const int64_t stride = thread_stride();
  for (int64_t i = first_thread(); i < n; i += stride) {
    const float s = bias != nullptr ? sums[i] + to_float(bias[i % cols]) : sums[i];
    if (pre_gelu == nullptr) {
      c[i] = from_float<T>(s);
    } else {
      pre_gelu[i] = from_float<T>(s);
      c[i] = from_float<T>(gelu_tanh(s));
    }
  }
}

}  // namespace

void gemm_epilogue(DType dtype, const float* sums, const void* bias, void* c, void* pre_gelu,
                   int64_t rows, int64_t cols, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n <= 0) return;
  MIXPREC_CUDA_DISPATCH_FLOATING(dtype, "gemm_epilogue", [&] {
    MIXPREC_LAUNCH(grid_for(n), kThreads, stream, gemm_epilogue_kernel<scalar_t>)(sums,
        static_cast<const scalar_t*>(bias), static_cast<scalar_t*>(c),
        static_cast<scalar_t*>(pre_gelu), n, cols);
    CUDA_CHECK_LAST();
  });
}

}  // namespace mixprec::kernels
