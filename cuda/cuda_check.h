// Status checks for CUDA runtime, cuBLAS and cuDNN calls. Internal to cuda/: this header
// includes the CUDA headers, so nothing above cuda/ may include it.
//
// Contract: each macro evaluates its expression exactly once. When the status is not the
// success value it throws mixprec::Error whose message holds the library, the status name,
// the library's description of it, the checked expression, the function that made the call
// (the op: the enclosing named function, also from inside lambdas such as the dtype
// dispatch's), and file:line of the call, e.g.
//   CUDA error cudaErrorInvalidValue (invalid argument) in `cudaMemset(p, 0, n)` in
//   cuda::fill at fill.cu:31
//   CUDA error cudaErrorInvalidConfiguration (invalid configuration argument) in the launch
//   of layer_norm_kernel in cuda::layer_norm at layer_norm.cu:162
//
//   CUDA_CHECK(cudaMalloc(&p, bytes));
//   my_kernel<<<grid, block, 0, stream>>>(...);
//   CUDA_CHECK_LAST();                 // launch-configuration errors of the kernel above
//   CUDA_CHECK_LAST("my_kernel");      // the same, naming the kernel (a string literal)
//   CUBLAS_CHECK(cublasCreate(&handle));
//   CUDNN_CHECK(cudnnCreate(&handle));
//
// Errors that a kernel raises while it runs (an illegal address, a device-side assert) are
// reported by the next call that waits for the device, not by the kernel's own check; their
// messages say so and how to find the kernel (CUDA_LAUNCH_BLOCKING=1).
#pragma once

#include <string>

#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "core/error.h"

namespace mixprec::detail {

// `function`: the compiler's name of the enclosing function (__PRETTY_FUNCTION__), shortened
// in the message to its qualified name without "mixprec::", anonymous namespaces, the
// signature and lambdas; null leaves it out.
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* expr, const char* file, int line,
                                   const char* function = nullptr);
// A kernel launch: `kernel` is the name given to CUDA_CHECK_LAST, or empty.
[[noreturn]] void throw_launch_error(cudaError_t status, const char* kernel, const char* file,
                                     int line, const char* function);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* expr, const char* file,
                                     int line, const char* function = nullptr);
[[noreturn]] void throw_cudnn_error(cudnnStatus_t status, const char* expr, const char* file,
                                    int line, const char* function = nullptr);

// "mixprec::cuda::layer_norm(DType, ...)::<lambda()> [with ...]" -> "cuda::layer_norm".
std::string function_name(const char* pretty_function);

}  // namespace mixprec::detail

#if defined(__GNUC__) || defined(__clang__)
#define MIXPREC_CUDA_FUNCTION __PRETTY_FUNCTION__
#else
#define MIXPREC_CUDA_FUNCTION __func__
#endif

#define CUDA_CHECK(expr)                                                               \
  do {                                                                                 \
    const cudaError_t mixprec_cuda_status_ = (expr);                                   \
    if (mixprec_cuda_status_ != cudaSuccess)                                           \
      ::mixprec::detail::throw_cuda_error(mixprec_cuda_status_, #expr, __FILE__, __LINE__, \
                                          MIXPREC_CUDA_FUNCTION);                      \
  } while (0)

// After a kernel launch: reports (and clears) a launch error such as an invalid grid. The
// optional argument, a string literal, names the kernel; the enclosing function names the op.
// Errors raised while the kernel runs surface at the next synchronizing call instead.
#define CUDA_CHECK_LAST(...)                                                           \
  do {                                                                                 \
    const cudaError_t mixprec_cuda_status_ = cudaGetLastError();                       \
    if (mixprec_cuda_status_ != cudaSuccess)                                           \
      ::mixprec::detail::throw_launch_error(mixprec_cuda_status_, "" __VA_ARGS__, __FILE__, \
                                            __LINE__, MIXPREC_CUDA_FUNCTION);          \
  } while (0)

#define CUBLAS_CHECK(expr)                                                             \
  do {                                                                                 \
    const cublasStatus_t mixprec_cublas_status_ = (expr);                              \
    if (mixprec_cublas_status_ != CUBLAS_STATUS_SUCCESS)                               \
      ::mixprec::detail::throw_cublas_error(mixprec_cublas_status_, #expr, __FILE__, __LINE__, \
                                            MIXPREC_CUDA_FUNCTION);                    \
  } while (0)

#define CUDNN_CHECK(expr)                                                              \
  do {                                                                                 \
    const cudnnStatus_t mixprec_cudnn_status_ = (expr);                                \
    if (mixprec_cudnn_status_ != CUDNN_STATUS_SUCCESS)                                 \
      ::mixprec::detail::throw_cudnn_error(mixprec_cudnn_status_, #expr, __FILE__, __LINE__, \
                                           MIXPREC_CUDA_FUNCTION);                     \
  } while (0)
