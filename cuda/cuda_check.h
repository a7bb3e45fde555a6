// Status checks for CUDA runtime, cuBLAS and cuDNN calls. Internal to cuda/: this header
// includes the CUDA headers, so nothing above cuda/ may include it.
//
// Contract: each macro evaluates its expression exactly once. When the status is not the
// success value it throws mixprec::Error whose message holds the library, the status name,
// the library's description of it, the checked expression, and file:line of the call, e.g.
//   CUDA error cudaErrorInvalidValue (invalid argument) in `cudaMemset(p, 0, n)` at fill.cu:31
//
//   CUDA_CHECK(cudaMalloc(&p, bytes));
//   my_kernel<<<grid, block, 0, stream>>>(...);
//   CUDA_CHECK_LAST();                       // launch-configuration errors of the kernel above
//   CUBLAS_CHECK(cublasCreate(&handle));
//   CUDNN_CHECK(cudnnCreate(&handle));
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "core/error.h"

namespace mixprec::detail {

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* expr, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* expr, const char* file,
                                     int line);
[[noreturn]] void throw_cudnn_error(cudnnStatus_t status, const char* expr, const char* file,
                                    int line);

}  // namespace mixprec::detail

#define CUDA_CHECK(expr)                                                               \
  do {                                                                                 \
    const cudaError_t mixprec_cuda_status_ = (expr);                                   \
    if (mixprec_cuda_status_ != cudaSuccess)                                           \
      ::mixprec::detail::throw_cuda_error(mixprec_cuda_status_, #expr, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: reports (and clears) a launch error such as an invalid grid.
// Errors raised while the kernel runs surface at the next synchronizing call instead.
#define CUDA_CHECK_LAST()                                                              \
  do {                                                                                 \
    const cudaError_t mixprec_cuda_status_ = cudaGetLastError();                       \
    if (mixprec_cuda_status_ != cudaSuccess)                                           \
      ::mixprec::detail::throw_cuda_error(mixprec_cuda_status_, "kernel launch", __FILE__, \
                                          __LINE__);                                   \
  } while (0)

#define CUBLAS_CHECK(expr)                                                             \
  do {                                                                                 \
    const cublasStatus_t mixprec_cublas_status_ = (expr);                              \
    if (mixprec_cublas_status_ != CUBLAS_STATUS_SUCCESS)                               \
      ::mixprec::detail::throw_cublas_error(mixprec_cublas_status_, #expr, __FILE__, __LINE__); \
  } while (0)

#define CUDNN_CHECK(expr)                                                              \
  do {                                                                                 \
    const cudnnStatus_t mixprec_cudnn_status_ = (expr);                                \
    if (mixprec_cudnn_status_ != CUDNN_STATUS_SUCCESS)                                 \
      ::mixprec::detail::throw_cudnn_error(mixprec_cudnn_status_, #expr, __FILE__, __LINE__); \
  } while (0)
