// Philox random fills (core/philox.h): element i draws from counter key.offset + i, so the
// values are those of the CPU backend for the same key. Internal to cuda/; asynchronous on
// `stream`; nothing is launched for n == 0.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/dtype.h"
#include "core/philox.h"

namespace mixprec::kernels {

// dst[i] = low + (high - low) * philox_uniform(seed, offset + i), rounded once to dtype.
void random_uniform(void* dst, DType dtype, int64_t n, PhiloxKey key, float low, float high,
                    cudaStream_t stream);
// dst[i] = mean + stddev * philox_normal(seed, offset + i), rounded once to dtype.
void random_normal(void* dst, DType dtype, int64_t n, PhiloxKey key, float mean, float stddev,
                   cudaStream_t stream);

}  // namespace mixprec::kernels
