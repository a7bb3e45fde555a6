// Layer normalisation over the last dim on the CUDA backend, with the per-element math of
// core/math/norm.h (the CPU backend's). Internal to cuda/; pointers are device memory,
// launches are asynchronous on `stream`. weight, bias, dweight and dbias may be null.
//
// Row statistics are FP32: each row's sums come from a fixed-order warp or block reduction
// (cuda/kernels/rows.cuh). The weight and bias gradients sum over the rows in column tiles:
// each split of the rows adds its rows in order, and the splits' FP32 partials are added in
// split order, with a split count fixed by the shape, so results are the same on every run.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/dtype.h"

namespace mixprec::kernels {

// y = (x - mean) * rstd * weight + bias per row; mean, rstd: F32 [rows].
void layer_norm(DType dtype, const void* x, const void* weight, const void* bias, float eps,
                void* y, float* mean, float* rstd, int64_t rows, int64_t cols,
                cudaStream_t stream);

// Floats of scratch that layer_norm_backward needs for the weight and bias gradients.
size_t layer_norm_backward_scratch_floats(int64_t rows, int64_t cols);

// dx from x, weight, the forward's statistics and dy; dweight and dbias (overwritten) when
// not null. scratch: layer_norm_backward_scratch_floats(rows, cols) floats (null when 0).
void layer_norm_backward(DType dtype, const void* x, const void* weight, const float* mean,
                         const float* rstd, const void* dy, void* dx, void* dweight, void* dbias,
                         int64_t rows, int64_t cols, float* scratch, cudaStream_t stream);

}  // namespace mixprec::kernels
