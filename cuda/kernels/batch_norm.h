// Batch normalisation kernels of the CUDA backend; the per-element and per-channel math is
// core/math/norm.h, shared with the CPU backend. Internal to cuda/. Pointers are device
// memory; x, y, dx, dy, weight, bias, dweight and dbias hold `dtype` (F32, F16 or BF16),
// everything else F32. Launches are asynchronous on `stream`.
//
// Statistics are those of the CPU backend, in double: per channel, the sum of x and then the
// sum of squared deviations from the mean (the CPU takes both from one pass centred on the
// channel's first value, core/math/norm.h; the two agree to double rounding before the
// result is rounded to FP32), and, backward, the sums of dy and of dy * xhat. They
// accumulate in an order fixed by the shape: each channel is cut into
// a number of splits that depends only on the layout, each split is summed by one block in a
// fixed thread order and tree, and the splits' partial sums are added in split order. The
// results are therefore the same bits on every run.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/dtype.h"

namespace mixprec::kernels {

// An NC... tensor seen as [n, c, inner].
struct BatchNormLayout {
  int64_t n = 0, c = 0, inner = 0;
  int64_t count() const { return n * inner; }  // values per channel
};

// Bytes of device scratch that the forward and backward passes need (256-byte aligned
// memory from the allocator).
size_t batch_norm_scratch_bytes(const BatchNormLayout& layout);

// y = (x - mean) * invstd * weight + bias per channel. Training: mean and biased variance of
// the batch, written to save_mean and save_invstd = 1 / sqrt(var + eps), and the running
// statistics updated with PyTorch's momentum and the unbiased variance (count() > 1).
// Otherwise the running statistics are used and copied to save_mean / save_invstd. relu:
// y = relu(...) in the same pass. layout.c > 0 and layout.count() > 0.
void batch_norm_forward(DType dtype, const BatchNormLayout& layout, const void* x,
                        const void* weight, const void* bias, float* running_mean,
                        float* running_var, bool training, float momentum, float eps, bool relu,
                        void* y, float* save_mean, float* save_invstd, void* scratch,
                        cudaStream_t stream);

// dweight = sum dy * xhat, dbias = sum dy, and dx: through the batch statistics when
// training (norm_backward_means), else dx = dy * weight * invstd. Same layout conditions.
// relu_bias non-null (the forward ran with relu and this bias): every dy is first passed
// through relu's derivative at the stored forward output, recomputed from x.
void batch_norm_backward(DType dtype, const BatchNormLayout& layout, const void* x,
                         const void* weight, const float* save_mean, const float* save_invstd,
                         const void* dy, bool training, const void* relu_bias, void* dx,
                         void* dweight, void* dbias, void* scratch, cudaStream_t stream);

}  // namespace mixprec::kernels
