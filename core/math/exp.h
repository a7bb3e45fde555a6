// exp(x) in FP32 as branch-free arithmetic that the compiler vectorises, shared by the CPU
// and CUDA backends (softmax, log-softmax's backward and cross-entropy call it once per
// element). libm's expf is a scalar call the compiler cannot vectorise; this form makes the
// CPU's softmax rows whole-vector loops, and both backends compute the same bits.
//
// Method: x = n ln2 + r with n = round(x log2 e) and |r| <= ln2 / 2 (ln2 in two parts, each
// product an fmaf), exp(r) by Cephes' degree-7 polynomial, and 2^n applied as two exact
// powers of two 2^(n/2) 2^(n - n/2), so that results in the subnormal range round once.
// Every multiply-add is an explicit fmaf: the bits do not depend on a compiler's own fusing.
//
// Accuracy (tests/core/test_exp.cpp sweeps it against double exp): within 2 ulp of the exact
// value for normal results; subnormal results (x below about -87.3) within 2 units of the
// smallest subnormal. Exactly +0 below x = -104 and for -inf, +inf above x = 89 and for +inf,
// exp(0) = 1 exactly, NaN for NaN.
#pragma once

#include <math.h>
#include <stdint.h>

#include "core/half.h"
#include "core/hd.h"

namespace mixprec {

MIXPREC_HD float exp_vectorisable(float x) {
  // Beyond these the result is 0 or infinity; the clamp also maps NaN to a number, so the
  // integer steps below stay defined (the NaN itself is returned at the end).
  const float xc = x > -104.0f ? (x < 89.0f ? x : 89.0f) : -104.0f;
  // n = round-to-nearest-even(x log2 e): adding 1.5 * 2^23 leaves n in the low mantissa bits.
  constexpr float kRound = 12582912.0f;
  const float shifted = fmaf(xc, 1.44269504088896341f, kRound);
  const float n = shifted - kRound;
  const int32_t ni = static_cast<int32_t>(detail::f32_to_bits(shifted) -
                                          detail::f32_to_bits(kRound));
  float r = fmaf(n, -0.693145751953125f, xc);
  r = fmaf(n, -1.428606765330187045e-6f, r);
  float p = 1.9875691500e-4f;
  p = fmaf(p, r, 1.3981999507e-3f);
  p = fmaf(p, r, 8.3334519073e-3f);
  p = fmaf(p, r, 4.1665795894e-2f);
  p = fmaf(p, r, 1.6666665459e-1f);
  p = fmaf(p, r, 5.0000001201e-1f);
  const float e_r = fmaf(p, r * r, r) + 1.0f;
  // n in [-150, 128]: each half of it is a normal power of two.
  const int32_t n1 = ni / 2, n2 = ni - n1;
  const float s1 = detail::f32_from_bits(static_cast<uint32_t>(n1 + 127) << 23);
  const float s2 = detail::f32_from_bits(static_cast<uint32_t>(n2 + 127) << 23);
  const float result = e_r * s1 * s2;
  return x != x ? x + x : result;
}

}  // namespace mixprec
