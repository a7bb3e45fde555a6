// The epilogue of a linear layer's GEMM as a kernel of its own, for products whose fused
// cuBLASLt epilogue is unavailable (cuda_gemm.cpp). Internal to cuda/. The values stored are
// GemmEpilogue's (core/backend.h), so the fused and the separate forms agree up to the
// library's own GELU.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/dtype.h"

namespace mixprec::kernels {

// For each element of the row-major rows x cols FP32 sums: s = sums + bias[column] (bias
// may be null: s = sums); pre_gelu = round(s) when pre_gelu is not null, then
// c = round(gelu_tanh(s)) with pre_gelu, round(s) without. bias, c and pre_gelu hold
// `dtype` (F32, F16 or BF16); c may be `sums` itself when dtype is F32. Asynchronous on
// `stream`; nothing is launched for an empty matrix.
void gemm_epilogue(DType dtype, const float* sums, const void* bias, void* c, void* pre_gelu,
                   int64_t rows, int64_t cols, cudaStream_t stream);

}  // namespace mixprec::kernels
