// Fill kernels: constant fills and arange. Internal to cuda/ (it includes CUDA headers).
// Every launcher is asynchronous on `stream`, launches nothing for n == 0 and throws
// mixprec::Error on a launch failure.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/dtype.h"

namespace mixprec::kernels {

// Sets dst[0..n) to `value`. dst must be device memory holding at least n floats.
void fill_f32(float* dst, float value, size_t n, cudaStream_t stream);

// Sets each of the n elements of dst (elements of `element_size` bytes: 2 or 4) to the bit
// pattern `bits` (its low 16 bits for 2-byte elements). Callers compute the pattern with the
// host's conversions, so a fill has the same bits on every backend.
void fill_bits(void* dst, size_t element_size, uint32_t bits, int64_t n, cudaStream_t stream);

// dst[i] = start + i * step, computed in double, then truncated toward zero for I32 or
// rounded once (through float) for the floating dtypes, as the CPU backend does.
void arange(void* dst, DType dtype, double start, double step, int64_t n, cudaStream_t stream);

}  // namespace mixprec::kernels
