// Dtype conversion. Internal to cuda/; asynchronous on `stream`.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/dtype.h"

namespace mixprec::kernels {

// dst[i] = src[i] converted, for n elements of two different dtypes: between floating
// dtypes through FP32 with one rounding (core/half.h, so NaN payloads and subnormals get the
// CPU backend's bits); float -> I32 truncates toward zero; I32 -> floating rounds once.
void cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n,
          cudaStream_t stream);

}  // namespace mixprec::kernels
