// One AVX-512 vector of 16 floats to and from FP16 and BF16, with exactly the bits of the
// scalar conversions of core/half.h (round to nearest even, subnormals kept, NaN quieted with
// its sign and top payload bits): the bulk converters (core/convert.cpp) and the GEMM kernels
// that round their results on store (core/cpu/packed_gemm.h) share them. BF16 is rounded in
// integer arithmetic: vcvtneps2bf16 would flush denormal inputs. Callers need AVX-512 F and BW
// (checked at run time) and a target that includes them.
#pragma once

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

namespace mixprec::avx512 {

__attribute__((target("avx512f,avx512bw"))) inline __m256i f32_to_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i hi = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)),
                                                 lsb),
                                16);
  const __mmask16 is_nan = _mm512_cmpgt_epu32_mask(
      _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
  r = _mm512_mask_mov_epi32(r, is_nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x0040)));
  return _mm512_cvtepi32_epi16(r);
}

__attribute__((target("avx512f,avx512bw"))) inline __m512 bf16_to_f32(__m256i b) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}

__attribute__((target("avx512f,avx512bw"))) inline __m256i f32_to_f16(__m512 v) {
  return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
}

__attribute__((target("avx512f,avx512bw"))) inline __m512 f16_to_f32(__m256i h) {
  return _mm512_cvtph_ps(h);
}

}  // namespace mixprec::avx512

#endif
