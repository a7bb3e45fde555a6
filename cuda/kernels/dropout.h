// Dropout on the CUDA backend: element i keeps its value when its Philox draw (word i % 4 of
// the block at counter key.offset + i / 4, core/math/dropout.h) is at least p, so the mask is
// the CPU backend's for the same key and the backward replays it with the same call on dy.
// Internal to cuda/; asynchronous on `stream`; nothing is launched for n == 0.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/dtype.h"
#include "core/philox.h"

namespace mixprec::kernels {

// y = x * keep / (1 - p), p in [0, 1); with a residual (else null), y = residual + that
// product rounded to the dtype first (Backend::dropout_add). y may alias x or the residual.
void dropout(DType dtype, const void* x, const void* residual, float p, PhiloxKey key, void* y,
             int64_t n, cudaStream_t stream);

}  // namespace mixprec::kernels
