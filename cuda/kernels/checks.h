// Whole-tensor checks whose answer stays on the device until the caller reads it. Internal
// to cuda/; asynchronous on `stream`.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/dtype.h"

namespace mixprec::kernels {

// *flag (device memory) becomes 1 when any of the n elements of the floating tensor x is
// Inf or NaN, else 0.
void flag_non_finite(const void* x, DType dtype, int64_t n, int32_t* flag, cudaStream_t stream);

// *first (device memory) becomes the smallest index i with ids[i] outside [0, upper), or
// UINT64_MAX when there is none.
void first_out_of_range(const int32_t* ids, int64_t n, int64_t upper, unsigned long long* first,
                        cudaStream_t stream);

}  // namespace mixprec::kernels
