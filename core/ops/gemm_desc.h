// Internal to core/ops (and their tests): GemmDesc values built in one expression, so that
// every op states its m, n, k and transposes in the order the Backend::gemm contract uses.
#pragma once

#include <cstdint>

#include "core/backend.h"

namespace mixprec::ops {

// One product C = alpha * op(A) @ op(B) + beta * C with op(A) m x k and op(B) k x n
// (batch 1, so the strides do not matter).
inline GemmDesc gemm_desc(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                          float alpha = 1.0f, float beta = 0.0f) {
  GemmDesc d;
  d.trans_a = trans_a;
  d.trans_b = trans_b;
  d.m = m;
  d.n = n;
  d.k = k;
  d.alpha = alpha;
  d.beta = beta;
  return d;
}

// The same product for each of `batch` items: A and B advance stride_a and stride_b
// elements per item (0 shares one matrix with the whole batch); the C items are packed,
// m * n elements apart.
inline GemmDesc batched_gemm_desc(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                  int64_t batch, int64_t stride_a, int64_t stride_b,
                                  float alpha = 1.0f, float beta = 0.0f) {
  GemmDesc d = gemm_desc(trans_a, trans_b, m, n, k, alpha, beta);
  d.batch = batch;
  d.stride_a = stride_a;
  d.stride_b = stride_b;
  d.stride_c = m * n;
  return d;
}

}  // namespace mixprec::ops
