// An 8 x 8 block of 32-bit values transposed in eight AVX registers (unpack, shuffle, then
// 128-bit lane swaps): the CPU's float transpose (core/cpu/cpu_tile_gemm.cpp) and the BF16 GEMM's
// packing of a transposed A (core/cpu/bf16_dot_gemm.cpp) share it. Callers' targets include AVX2.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

namespace mixprec::cpu {

// out[c] lane r = rows[r] lane c.
__attribute__((target("avx2"))) inline void transpose8x8(const __m256 (&rows)[8],
                                                         __m256 (&out)[8]) {
  __m256 t[8], u[8];
#pragma GCC unroll 8
  for (int k = 0; k < 8; k += 2) {
    t[k] = _mm256_unpacklo_ps(rows[k], rows[k + 1]);
    t[k + 1] = _mm256_unpackhi_ps(rows[k], rows[k + 1]);
  }
#pragma GCC unroll 8
  for (int k = 0; k < 8; k += 4) {
    u[k] = _mm256_shuffle_ps(t[k], t[k + 2], 0x44);
    u[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], 0xEE);
    u[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0x44);
    u[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0xEE);
  }
#pragma GCC unroll 8
  for (int k = 0; k < 4; ++k) {
    out[k] = _mm256_permute2f128_ps(u[k], u[k + 4], 0x20);
    out[k + 4] = _mm256_permute2f128_ps(u[k], u[k + 4], 0x31);
  }
}

}  // namespace mixprec::cpu

#endif
