// Fill kernel: the smallest real kernel of the backend, used to check the nvcc build path
// and a device end to end. Internal to cuda/ (it includes CUDA headers).
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

namespace mixprec::kernels {

// Sets dst[0..n) to `value` on `stream` (asynchronously, like every launch). dst must be
// device memory holding at least n floats; n == 0 launches nothing. Throws mixprec::Error on
// a launch failure.
void fill_f32(float* dst, float value, size_t n, cudaStream_t stream);

}  // namespace mixprec::kernels
