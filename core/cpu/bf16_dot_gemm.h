// BF16 matrix products on the CPU's native BF16 dot-product instruction (AVX512-BF16's
// vdpbf16ps: two BF16 products accumulated into each FP32 lane, twice the FP32 FMA rate, half
// the bytes moved). The CPU backend's BF16 GEMMs take this path when the CPU has the
// instruction (chosen at run time from CPUID); the widen-to-FP32 path (core/cpu/cpu_gemm.cpp)
// is the fallback on other CPUs and whenever the switch below turns this one off, which keeps
// the exact path available as the oracle.
//
// Numerics (docs/numerics.md, "BF16 dot products on the CPU"): each sum starts from zero and
// takes the k products in pairs (2p, 2p+1), ascending p, the odd one first; a BF16 product is
// exact in FP32, and each addition rounds to nearest even, so a sum is the FP32 sum of its k
// products in that order. BF16 inputs that are denormal count as zero and a denormal result
// of an addition may be flushed to zero, as the instruction does. The order differs from the
// widened path's (Eigen's blocking), so the two agree within FP32 summation error, not bit for
// bit; each result is the same whatever the thread count.
#pragma once

#include <cstdint>
#include <string>

#include "core/half.h"

namespace mixprec::cpu {

// True when the CPU has AVX512-BF16 (with AVX-512F) and the path is allowed: not switched off
// by set_bf16_dot_allowed(false), nor by the environment variable MIXPREC_CPU_BF16_DOT=0 read
// at the first call.
bool bf16_dot_available();

// The path BF16 products take here, for people: "AVX512-BF16 dot products", or "widened to
// FP32" with the reason (no AVX512-BF16, or switched off).
std::string bf16_products_path();

// Switches the path off (false) or back on, for every thread; the tests use it to run the
// widened path on a CPU that has the instruction. Not to be called while a product runs.
void set_bf16_dot_allowed(bool allowed);

// sums = alpha * op(a) @ op(b) + beta * sums, with a and b BF16 and sums FP32 (m x n,
// row-major): op(a) is m x k (a stored k x m when trans_a), op(b) is k x n (b stored n x k
// when trans_b), all with natural leading dimensions. beta == 0 never reads sums; otherwise
// the result is fma(beta, old, alpha * sum). Packs its operands into buffers of its own, kept
// per thread between calls, so it leaves the caller's scratch slots (core/cpu/cpu_gemm.h)
// alone.
// Outside an OpenMP parallel region a large product spreads over the threads; inside one it
// runs on the calling thread. Requires bf16_dot_available() (throws mixprec::Error
// otherwise).
void gemm_bf16_dot(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const bfloat16* a, const bfloat16* b, float beta, float* sums);

// The same product into a BF16 C: c = alpha * op(a) @ op(b) + beta * c, each element summed in
// FP32 (the old value widened when beta != 0) and rounded once on store, with the bits of
// from_float.
void gemm_bf16_dot(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const bfloat16* a, const bfloat16* b, float beta, bfloat16* c);

}  // namespace mixprec::cpu
