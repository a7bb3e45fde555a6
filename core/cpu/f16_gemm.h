// FP16 matrix products on the CPU without whole-tensor conversion passes: the operands are
// widened to FP32 (F16C) as the product packs them (A's rows and B's panels, each once), and
// the FP32 sums are kept in registers.
// CPUs with AVX-512 (F, VL and BW), AVX2, FMA and F16C take this path, unless the AVX-512
// kernels are switched off (core/cpu/tile_gemm.h); others widen the operands and use
// Eigen's product (core/cpu/cpu_gemm.cpp). No CPU's native FP16 arithmetic is used: it would
// accumulate in FP16, where mixed precision promises FP32 sums.
//
// Numerics: each sum starts from zero and adds the k products a(i, p) * b(p, j) in ascending
// p, each with one fused multiply-add (an FP16 value is exact in FP32), so a result is the
// same whatever the thread count. The order differs from Eigen's blocking, so the two paths
// agree within FP32 summation error, not bit for bit.
#pragma once

#include <cstdint>
#include <string>

#include "core/half.h"

namespace mixprec::cpu {

// True when this CPU runs gemm_f16_packed (and the AVX-512 kernels are not switched off,
// core/cpu/tile_gemm.h).
bool f16_packed_available();

// The path FP16 products take here, for people: "widened to FP32 as packed (F16C)", or
// "widened to FP32 once" with the reason.
std::string f16_products_path();

// sums = alpha * op(a) @ op(b) + beta * sums, with a and b FP16 and sums FP32 (m x n,
// row-major); the operand conventions of gemm_bf16_dot (core/cpu/bf16_dot_gemm.h). beta == 0
// never reads sums; otherwise the result is fma(beta, old, alpha * sum). Outside an OpenMP
// parallel region a large product spreads over the threads; inside one it runs on the calling
// thread. Requires f16_packed_available() (throws mixprec::Error otherwise).
void gemm_f16_packed(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                     const half* a, const half* b, float beta, float* sums);

// The same product into an FP16 C: c = alpha * op(a) @ op(b) + beta * c, each element summed
// in FP32 (the old value widened when beta != 0) and rounded once on store, with the bits of
// from_float.
void gemm_f16_packed(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                     const half* a, const half* b, float beta, half* c);

}  // namespace mixprec::cpu
