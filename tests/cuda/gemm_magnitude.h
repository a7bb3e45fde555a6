// The size of what a GEMM sums into each element of C, for comparing a backend's GEMM with
// another within a tolerance relative to it (expect_close's `magnitude`). Shared by the CUDA
// GEMM tests.
#pragma once

#include <vector>

#include "core/backend.h"
#include "core/tensor.h"

namespace mixprec::cuda_test {

// |alpha| * sum_k |op(A)[i,k] op(B)[k,j]| + |beta * C[i,j]| for every element of C (elements
// outside the batch's matrices: 0), in double. A GEMM in the tests' own code, so it has a
// source file of its own, which the sanitized build compiles with optimisation
// (tests/CMakeLists.txt).
std::vector<float> gemm_magnitude(const GemmDesc& d, const Tensor& a, const Tensor& b,
                                  const Tensor& c);

}  // namespace mixprec::cuda_test
