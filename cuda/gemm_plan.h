// How a row-major GEMM (GemmDesc, core/backend.h) becomes one column-major cuBLASLt matmul.
// Kept free of CUDA headers so that the mapping can be checked on a machine without a device;
// cuda_gemm.cpp turns it into cuBLASLt descriptors.
//
// A row-major R x C matrix is the column-major C x R matrix of the same bytes, so row-major
// C = op(A) @ op(B) is computed as the column-major C^T = op(B)^T @ op(A)^T: cuBLASLt's first
// operand is B's bytes, its second is A's, each keeping its own transpose flag, and the
// output is n x m with leading dimension n.
#pragma once

#include <cstdint>

#include "core/backend.h"

namespace mixprec {

// An operand of the row-major GemmDesc.
enum class GemmOperand { A, B };

// A column-major rows x cols matrix with leading dimension ld; the matrices of a batch are
// `stride` elements apart (0 when the batch has one matrix, or when one is broadcast).
struct LtMatrixLayout {
  int64_t rows = 0, cols = 0, ld = 0;
  int64_t stride = 0;
};

// One input of the cuBLASLt matmul: whose bytes it reads, and whether cuBLASLt applies
// CUBLAS_OP_T (true) or CUBLAS_OP_N to it.
struct LtInput {
  GemmOperand source = GemmOperand::A;
  bool transpose = false;
  LtMatrixLayout layout;
};

// D = alpha * op(a) @ op(b) + beta * C in cuBLASLt's column-major terms, `batch` times; C
// and D share `c` (the same memory in every call), whose bytes are GemmDesc's C.
struct LtGemmMapping {
  LtInput a, b;
  LtMatrixLayout c;
  int64_t batch = 1;
};

// Requires m, n, k and batch >= 1 (the backend handles empty problems without cuBLASLt).
// Strides of a batch of one are dropped to 0, so problems that differ only there map alike.
LtGemmMapping map_gemm_to_cublaslt(const GemmDesc& desc);

}  // namespace mixprec
