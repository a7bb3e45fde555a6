// Softmax, log-softmax and the fused softmax-cross-entropy of the CUDA backend, with the
// per-element math of core/math/softmax.h (the CPU backend's). Internal to cuda/; pointers
// are device memory of contiguous rows, launches are asynchronous on `stream` and nothing
// is launched for an empty tensor.
//
// Each row is reduced to its maximum m and s = sum exp(x - m); as on the CPU, the sums (and
// the dot product of the backward) accumulate in double and are rounded to float once, and
// cross-entropy keeps m and log(s) apart. The loss is the double sum of the row losses in a
// fixed order, so it reads the same on every run.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/dtype.h"
#include "core/philox.h"

namespace mixprec::kernels {

// y = softmax(x) (or log-softmax) over rows of `cols`, in dtype.
void softmax(DType dtype, const void* x, void* y, int64_t rows, int64_t cols, bool log,
             cudaStream_t stream);
void softmax_backward(DType dtype, const void* y, const void* dy, void* dx, int64_t rows,
                      int64_t cols, bool log, cudaStream_t stream);

// Backend::attention_softmax over `rows` rows of `cols` F32 scores, row r being row
// r % matrix_rows of its matrix: probs (F32) and operand (dtype) as that contract says, bit
// for bit causal_mask, softmax, dropout and cast composed from these kernels.
void attention_softmax(DType dtype, const float* scores, float p, PhiloxKey key, float* probs,
                       void* operand, int64_t rows, int64_t matrix_rows, int64_t cols,
                       cudaStream_t stream);
// Backend::attention_softmax_backward: ds (dtype) from F32 probs and dprobs.
void attention_softmax_backward(DType dtype, const float* probs, const float* dprobs, float p,
                                PhiloxKey key, void* ds, int64_t rows, int64_t cols,
                                cudaStream_t stream);

// Doubles of scratch that cross_entropy needs: one row loss per row.
inline size_t cross_entropy_scratch_doubles(int64_t rows) { return static_cast<size_t>(rows); }

// row_stats (F32 [rows, 2]) = per row (m, log s); loss (F32 [1]) = the mean row loss.
// labels: I32 [rows] in [0, cols). scratch: cross_entropy_scratch_doubles(rows) doubles.
void cross_entropy(DType dtype, const void* logits, const int32_t* labels, int64_t rows,
                   int64_t cols, float* loss, float* row_stats, double* scratch,
                   cudaStream_t stream);
// dlogits = dloss / rows * (softmax(logits) - onehot(labels)), from the forward's row_stats.
// dloss (F32 [1]) is read on the device.
void cross_entropy_backward(DType dtype, const void* logits, const int32_t* labels,
                            const float* row_stats, const float* dloss, void* dlogits,
                            int64_t rows, int64_t cols, cudaStream_t stream);

}  // namespace mixprec::kernels
