#include "tests/cuda/gemm_magnitude.h"

#include <cmath>
#include <cstdint>

namespace mixprec::cuda_test {

namespace {

// Element (i, j) of op(X), X stored row-major as rows x cols before the transpose.
double op_at(const std::vector<float>& x, int64_t offset, bool trans, int64_t cols, int64_t i,
             int64_t j) {
  return trans ? x[offset + j * cols + i] : x[offset + i * cols + j];
}

}  // namespace

std::vector<float> gemm_magnitude(const GemmDesc& d, const Tensor& a, const Tensor& b,
                                  const Tensor& c) {
  const std::vector<float> av = a.to_float_vector(), bv = b.to_float_vector(),
                           cv = c.to_float_vector();
  std::vector<float> mag(cv.size(), 0.0f);
  const int64_t a_cols = d.trans_a ? d.m : d.k, b_cols = d.trans_b ? d.k : d.n;
  for (int64_t p = 0; p < d.batch; ++p)
    for (int64_t i = 0; i < d.m; ++i)
      for (int64_t j = 0; j < d.n; ++j) {
        double s = 0.0;
        for (int64_t q = 0; q < d.k; ++q) {
          s += std::fabs(op_at(av, p * d.stride_a, d.trans_a, a_cols, i, q) *
                         op_at(bv, p * d.stride_b, d.trans_b, b_cols, q, j));
        }
        const size_t at = static_cast<size_t>(p * d.stride_c + i * d.n + j);
        const double prior = d.beta == 0.0f ? 0.0 : std::fabs(d.beta * cv[at]);
        mag[at] = static_cast<float>(std::fabs(d.alpha) * s + prior);
      }
  return mag;
}

}  // namespace mixprec::cuda_test
