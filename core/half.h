// FP16 (IEEE binary16) and BF16 (bfloat16) storage types and their scalar conversions.
//
// Contract:
// - float -> FP16/BF16 is IEEE round-to-nearest, ties-to-even, with gradual underflow:
//   FP16 results can be subnormal down to 2^-24, BF16 results down to 2^-133. Magnitudes at
//   or past the rounding midpoint above the largest finite value become infinity (FP16:
//   |x| >= 65520; BF16: |x| >= 0x1.FFp127). Signed zeros and infinities are kept.
// - FP16/BF16 -> float is exact (every 16-bit value is representable in FP32).
// - NaN stays NaN with its sign. float -> 16 bit keeps the top payload bits that fit and sets
//   the quiet bit (FP16: sign | 0x7E00 | mantissa >> 13; BF16: bits >> 16 | 0x0040). FP16 ->
//   float sets the quiet bit and keeps the payload (sign | 0x7FC00000 | mantissa << 13).
//   These are exactly what x86 F16C (vcvtps2ph/vcvtph2ps) and AVX512-BF16 produce, so the
//   vectorized bulk paths in core/convert.h give the same bits as these functions. BF16 ->
//   float is a plain shift, so a signaling BF16 NaN stays signaling.
// - The arithmetic is integer-only: results do not depend on the FP rounding mode or on
//   FTZ/DAZ, and host and device (MIXPREC_HD) round identically. On the device, non-NaN FP16
//   values convert with the hardware's cvt instructions instead, which are exactly this
//   rounding (IEEE round-to-nearest-even with subnormals, exact widening) in one instruction
//   where the integer path takes a dozen: FP16 kernels would otherwise spend more time
//   converting than moving memory. NaNs keep the integer path, whose payload rules the
//   hardware's canonical NaN does not follow.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/hd.h"

namespace mixprec {

namespace detail {

// memcpy rather than a union or pointer cast: it is the one bit cast that is defined
// behaviour in C++ and still compiles to a register move. Device code has an intrinsic.
MIXPREC_HD uint32_t f32_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

MIXPREC_HD float f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

}  // namespace detail

MIXPREC_HD uint16_t float_to_half_bits(float f) {
  const uint32_t u = detail::f32_to_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) {  // NaN
    return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x03FFu));
  }
#if defined(__CUDA_ARCH__)
  // Round-to-nearest-even, overflow to infinity, subnormal results kept (no .ftz, and float
  // subnormal inputs round to a signed zero either way).
  uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#else
  if (a >= 0x477FF000u) {  // >= 65520, the midpoint between 65504 and 2^16: ties go to inf
    return static_cast<uint16_t>(sign | 0x7C00u);
  }
  if (a >= 0x38800000u) {  // >= 2^-14: the result is a normal FP16
    // Rebiasing the exponent (127 -> 15) is one subtraction because the fields line up; the
    // rounding carry may then ripple from the mantissa into the exponent, which is exactly
    // the right answer at a binade boundary.
    uint32_t v = a - 0x38000000u;
    v += 0x0FFFu + ((v >> 13) & 1u);
    return static_cast<uint16_t>(sign | (v >> 13));
  }
  if (a <= 0x33000000u) {  // <= 2^-25: rounds to zero (2^-25 itself is a tie, 0 is even)
    return sign;
  }
  // Subnormal FP16: the value in units of 2^-24 is m * 2^(e - 126), with shift 14..24.
  const uint32_t e = a >> 23;
  const uint32_t m = (a & 0x007FFFFFu) | 0x00800000u;
  const uint32_t shift = 126u - e;
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  if (rem > halfway || (rem == halfway && (q & 1u))) ++q;  // q == 0x400 encodes 2^-14
  return static_cast<uint16_t>(sign | q);
#endif
}

MIXPREC_HD float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu;
  uint32_t m = h & 0x03FFu;
  if (e == 0x1Fu) {
    const uint32_t quiet = m != 0 ? 0x00400000u : 0u;
    return detail::f32_from_bits(sign | 0x7F800000u | quiet | (m << 13));
  }
#if defined(__CUDA_ARCH__)
  float f;  // exact: every FP16 value, subnormals included, is a normal float
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#else
  if (e != 0) return detail::f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
  if (m == 0) return detail::f32_from_bits(sign);
  // Subnormal FP16 is a normal float: shift the leading one up to the implicit-bit place.
  // A loop (at most 10 steps) rather than a count-leading-zeros builtin keeps this portable
  // between host compilers and device code.
  uint32_t exp = 113;  // exponent of 2^-14, lowered once per shift
  while ((m & 0x0400u) == 0) {
    m <<= 1;
    --exp;
  }
  return detail::f32_from_bits(sign | (exp << 23) | ((m & 0x03FFu) << 13));
#endif
}

MIXPREC_HD uint16_t float_to_bf16_bits(float f) {
  const uint32_t u = detail::f32_to_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
    // Truncating alone could leave an all-zero mantissa (an infinity), so set the quiet bit.
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  }
  // BF16 is the top half of a float: adding just under half an ulp plus the kept lsb rounds
  // to nearest-even, carrying into the exponent (and up to infinity) where needed. Float
  // subnormals round the same way because the exponent field needs no rebiasing.
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

MIXPREC_HD float bf16_bits_to_float(uint16_t b) {
  return detail::f32_from_bits(static_cast<uint32_t>(b) << 16);
}

// Storage type for FP16. Arithmetic happens in float: convert on load, round once on store.
// The float constructor is explicit because it rounds; the conversion back is exact.
struct half {
  uint16_t bits;

  half() = default;
  MIXPREC_HD explicit half(float f) : bits(float_to_half_bits(f)) {}
  MIXPREC_HD operator float() const { return half_bits_to_float(bits); }
  static MIXPREC_HD half from_bits(uint16_t b) {
    half h;
    h.bits = b;
    return h;
  }
};

// Storage type for BF16; same conventions as half.
struct bfloat16 {
  uint16_t bits;

  bfloat16() = default;
  MIXPREC_HD explicit bfloat16(float f) : bits(float_to_bf16_bits(f)) {}
  MIXPREC_HD operator float() const { return bf16_bits_to_float(bits); }
  static MIXPREC_HD bfloat16 from_bits(uint16_t b) {
    bfloat16 v;
    v.bits = b;
    return v;
  }
};

// Tensors hand raw buffers of these to kernels and to memcpy, so the layout must be the bare
// 16-bit pattern.
static_assert(sizeof(half) == 2 && sizeof(bfloat16) == 2);
static_assert(std::is_trivially_copyable_v<half> && std::is_trivially_copyable_v<bfloat16>);
static_assert(std::is_standard_layout_v<half> && std::is_standard_layout_v<bfloat16>);

// Kernels templated on the storage type load with to_float and store with from_float<T>, so
// FP32 storage takes the same code path with identity conversions.
MIXPREC_HD float to_float(float x) { return x; }
MIXPREC_HD float to_float(half x) { return half_bits_to_float(x.bits); }
MIXPREC_HD float to_float(bfloat16 x) { return bf16_bits_to_float(x.bits); }

template <class T>
MIXPREC_HD T from_float(float x) {
  static_assert(sizeof(T) == 0, "from_float<T>: T must be float, half or bfloat16");
  return T(x);
}
template <>
MIXPREC_HD float from_float<float>(float x) {
  return x;
}
template <>
MIXPREC_HD half from_float<half>(float x) {
  return half(x);
}
template <>
MIXPREC_HD bfloat16 from_float<bfloat16>(float x) {
  return bfloat16(x);
}

// Range limits, as floats (all exactly representable).
inline constexpr float kHalfMax = 65504.0f;            // 0x7BFF
inline constexpr float kHalfMinNormal = 0x1p-14f;      // 0x0400
inline constexpr float kHalfMinSubnormal = 0x1p-24f;   // 0x0001
inline constexpr float kBf16Max = 0x1.FEp127f;         // 0x7F7F, about 3.3895314e38
inline constexpr float kBf16MinNormal = 0x1p-126f;     // 0x0080
inline constexpr float kBf16MinSubnormal = 0x1p-133f;  // 0x0001

}  // namespace mixprec
