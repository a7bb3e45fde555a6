// Elementwise maps of the CUDA backend: the per-element math is core/math/elementwise.h,
// shared with the CPU backend. Internal to cuda/. All pointers are device memory holding n
// elements of `dtype` (F32, F16 or BF16); outputs may alias inputs; launches are
// asynchronous on `stream` and nothing is launched for n == 0.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/dtype.h"
#include "core/op_kinds.h"

namespace mixprec::kernels {

// y = op(x).
void unary(UnaryOp op, DType dtype, const void* x, void* y, int64_t n, cudaStream_t stream);
// dx = unary_grad(op, x, y, dy).
void unary_backward(UnaryOp op, DType dtype, const void* x, const void* y, const void* dy,
                    void* dx, int64_t n, cudaStream_t stream);
// y = alpha * x + beta.
void affine(DType dtype, const void* x, float alpha, float beta, void* y, int64_t n,
            cudaStream_t stream);
// y = scale * x.
void scale(DType dtype, const void* x, float scale, void* y, int64_t n, cudaStream_t stream);
// For each of `batch` [rows, cols] matrices: y[i][j] = fill where j > i, else x[i][j].
void causal_mask(DType dtype, const void* x, float fill, void* y, int64_t batch, int64_t rows,
                 int64_t cols, cudaStream_t stream);

}  // namespace mixprec::kernels
