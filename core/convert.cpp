#include "core/convert.h"

#include "core/half.h"

#if defined(__x86_64__) || defined(__i386__)
#define MIXPREC_CONVERT_X86 1
#include <cpuid.h>
#include <immintrin.h>

#include "core/convert_avx512.h"
#else
#define MIXPREC_CONVERT_X86 0
#endif

namespace mixprec {
namespace detail {

void convert_f32_to_f16_scalar(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = float_to_half_bits(src[i]);
}

void convert_f16_to_f32_scalar(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = half_bits_to_float(src[i]);
}

void convert_f32_to_bf16_scalar(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = float_to_bf16_bits(src[i]);
}

void convert_bf16_to_f32_scalar(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_float(src[i]);
}

#if MIXPREC_CONVERT_X86

// GCC 12 reports the _mm512_undefined_*() placeholders inside its own AVX-512 intrinsics as
// maybe-uninitialized once they are inlined here (GCC bug 105593); the lanes are all written.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace {

// Each kernel carries its own target attribute so that the library can be built for a
// baseline x86-64 and still use the wider instructions where the CPU reports them.
// __builtin_cpu_supports also checks that the OS saves the wider registers (XCR0).
bool cpu_has_f16c() {
#if defined(__clang__)
  // Older clang rejects "f16c" in __builtin_cpu_supports, so read CPUID leaf 1 directly.
  // OS support for the YMM state it needs is covered by the "avx2" check beside it.
  unsigned eax, ebx, ecx, edx;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
#else
  return __builtin_cpu_supports("f16c");
#endif
}

bool cpu_has_avx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
  }();
  return has;
}

bool cpu_has_avx512() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  }();
  return has;
}

// vcvtps2ph with an immediate rounding mode ignores MXCSR (rounding, FTZ and DAZ alike) and
// produces the same NaNs as float_to_half_bits, so no fix-up pass is needed.
__attribute__((target("avx2,f16c,fma"))) void f32_to_f16_avx2(const float* src, uint16_t* dst,
                                                              size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  convert_f32_to_f16_scalar(src + i, dst + i, n - i);
}

__attribute__((target("avx2,f16c,fma"))) void f16_to_f32_avx2(const uint16_t* src, float* dst,
                                                              size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  convert_f16_to_f32_scalar(src + i, dst + i, n - i);
}

// The integer form of float_to_bf16_bits. vcvtneps2bf16 is not used because it flushes
// subnormal inputs and outputs to zero, which the scalar path (and IEEE) does not.
__attribute__((target("avx2,f16c,fma"))) void f32_to_bf16_avx2(const float* src, uint16_t* dst,
                                                               size_t n) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i inf = _mm256_set1_epi32(0x7F800000);
  const __m256i bias = _mm256_set1_epi32(0x7FFF);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i quiet = _mm256_set1_epi32(0x0040);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i hi = _mm256_srli_epi32(u, 16);
    const __m256i lsb = _mm256_and_si256(hi, one);
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, bias), lsb), 16);
    // A signed compare is enough: the masked magnitudes are non-negative.
    const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
    r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, quiet), is_nan);
    // Every lane is <= 0xFFFF, so the unsigned-saturating pack is exact; it packs within
    // 128-bit halves, so gather qwords 0 and 2 into the low half before storing it.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_castsi256_si128(packed));
  }
  convert_f32_to_bf16_scalar(src + i, dst + i, n - i);
}

__attribute__((target("avx2,f16c,fma"))) void bf16_to_f32_avx2(const uint16_t* src, float* dst,
                                                               size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m256i u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), u);
  }
  convert_bf16_to_f32_scalar(src + i, dst + i, n - i);
}

// The last n % 16 elements of an AVX-512 conversion, as one masked vector instead of the
// scalar loop: masked loads read nothing past the end, and the 16-bit side goes through a
// 512-bit register so that AVX-512 BW suffices (the 256-bit masked forms need VL as well).
struct TailMasks {
  __mmask16 floats;
  __mmask32 halves;
};

inline TailMasks tail_masks(size_t rest) {
  const uint32_t bits = (uint32_t{1} << rest) - 1u;  // rest < 16
  return {static_cast<__mmask16>(bits), static_cast<__mmask32>(bits)};
}

__attribute__((target("avx512f,avx512bw"))) inline __m256i load_halves(TailMasks tail,
                                                                      const uint16_t* src) {
  return _mm512_castsi512_si256(_mm512_maskz_loadu_epi16(tail.halves, src));
}

__attribute__((target("avx512f,avx512bw"))) inline void store_halves(TailMasks tail,
                                                                    uint16_t* dst, __m256i v) {
  _mm512_mask_storeu_epi16(dst, tail.halves, _mm512_zextsi256_si512(v));
}

__attribute__((target("avx512f,avx512bw"))) void f32_to_f16_avx512(const float* src, uint16_t* dst,
                                                                   size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        avx512::f32_to_f16(_mm512_loadu_ps(src + i)));
  if (i == n) return;
  const TailMasks tail = tail_masks(n - i);
  store_halves(tail, dst + i, avx512::f32_to_f16(_mm512_maskz_loadu_ps(tail.floats, src + i)));
}

__attribute__((target("avx512f,avx512bw"))) void f16_to_f32_avx512(const uint16_t* src, float* dst,
                                                                   size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, avx512::f16_to_f32(_mm256_loadu_si256(
                                  reinterpret_cast<const __m256i*>(src + i))));
  if (i == n) return;
  const TailMasks tail = tail_masks(n - i);
  _mm512_mask_storeu_ps(dst + i, tail.floats, avx512::f16_to_f32(load_halves(tail, src + i)));
}

__attribute__((target("avx512f,avx512bw"))) void f32_to_bf16_avx512(const float* src, uint16_t* dst,
                                                                    size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        avx512::f32_to_bf16(_mm512_loadu_ps(src + i)));
  if (i == n) return;
  const TailMasks tail = tail_masks(n - i);
  store_halves(tail, dst + i, avx512::f32_to_bf16(_mm512_maskz_loadu_ps(tail.floats, src + i)));
}

__attribute__((target("avx512f,avx512bw"))) void bf16_to_f32_avx512(const uint16_t* src, float* dst,
                                                                    size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, avx512::bf16_to_f32(_mm256_loadu_si256(
                                  reinterpret_cast<const __m256i*>(src + i))));
  if (i == n) return;
  const TailMasks tail = tail_masks(n - i);
  _mm512_mask_storeu_ps(dst + i, tail.floats, avx512::bf16_to_f32(load_halves(tail, src + i)));
}

}  // namespace

bool vector_isa_supported(VectorIsa isa) {
  return isa == VectorIsa::kAvx512 ? cpu_has_avx512() : cpu_has_avx2();
}

#define MIXPREC_CONVERT_DISPATCH(name, Src, Dst)                                           \
  bool convert_##name##_vector(VectorIsa isa, const Src* src, Dst* dst, size_t n) {        \
    if (!vector_isa_supported(isa)) return false;                                          \
    if (isa == VectorIsa::kAvx512) {                                                       \
      name##_avx512(src, dst, n);                                                          \
    } else {                                                                               \
      name##_avx2(src, dst, n);                                                            \
    }                                                                                      \
    return true;                                                                           \
  }                                                                                        \
  bool convert_##name##_vector(const Src* src, Dst* dst, size_t n) {                       \
    if (!cpu_has_avx512()) return convert_##name##_vector(VectorIsa::kAvx2, src, dst, n);  \
    name##_avx512(src, dst, n); /* checked once: this runs per block of every 16-bit op */  \
    return true;                                                                           \
  }

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#else  // not x86: no vector paths; the public functions fall back to the scalar loops.

bool vector_isa_supported(VectorIsa) { return false; }

#define MIXPREC_CONVERT_DISPATCH(name, Src, Dst)                                      \
  bool convert_##name##_vector(VectorIsa, const Src*, Dst*, size_t) { return false; } \
  bool convert_##name##_vector(const Src*, Dst*, size_t) { return false; }

#endif

MIXPREC_CONVERT_DISPATCH(f32_to_f16, float, uint16_t)
MIXPREC_CONVERT_DISPATCH(f16_to_f32, uint16_t, float)
MIXPREC_CONVERT_DISPATCH(f32_to_bf16, float, uint16_t)
MIXPREC_CONVERT_DISPATCH(bf16_to_f32, uint16_t, float)

#undef MIXPREC_CONVERT_DISPATCH

}  // namespace detail

void convert_f32_to_f16(const float* src, uint16_t* dst, size_t n) {
  if (!detail::convert_f32_to_f16_vector(src, dst, n))
    detail::convert_f32_to_f16_scalar(src, dst, n);
}

void convert_f16_to_f32(const uint16_t* src, float* dst, size_t n) {
  if (!detail::convert_f16_to_f32_vector(src, dst, n))
    detail::convert_f16_to_f32_scalar(src, dst, n);
}

void convert_f32_to_bf16(const float* src, uint16_t* dst, size_t n) {
  if (!detail::convert_f32_to_bf16_vector(src, dst, n))
    detail::convert_f32_to_bf16_scalar(src, dst, n);
}

void convert_bf16_to_f32(const uint16_t* src, float* dst, size_t n) {
  if (!detail::convert_bf16_to_f32_vector(src, dst, n))
    detail::convert_bf16_to_f32_scalar(src, dst, n);
}

}  // namespace mixprec
