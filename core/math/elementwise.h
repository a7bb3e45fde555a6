// Per-element math of the elementwise family, shared by the CPU and CUDA backends.
//
// Every function takes and returns FP32: kernels load F16/BF16 with to_float(), call these,
// and round once on store. The op is a template parameter so that a kernel instantiates one
// branch-free loop per op; `unary_value` and `unary_grad` are the runtime-dispatched forms.
//
// Derivatives: unary_grad(x, y, dy) returns dx = dy * f'(x), where y = f(x) as stored in the
// output tensor (so in F16/BF16 it is the rounded value). Ops whose derivative is cheaper
// from the output read y (exp, sqrt, sigmoid, tanh); the others read x only.
// unary_grad_reads_output() says which, so callers know what to keep for backward.
#pragma once

#include <math.h>

#include "core/op_kinds.h"
#include "core/hd.h"

namespace mixprec {

// sqrt(2 / pi) and the cubic coefficient of GPT-2's tanh approximation of GELU.
inline constexpr float kGeluTanhScale = 0.7978845608028654f;
inline constexpr float kGeluTanhCubic = 0.044715f;

// tanh as the odd rational minimax approximation that Eigen and XLA use for float: within
// 3e-7 of the exact value everywhere, |result| <= 1, exactly +-1 from |x| = 7.9053 on, x
// itself below |x| = 4e-4, NaN for NaN. Unlike libm's tanhf it is branch-free arithmetic that
// the compiler vectorises (about 50x faster on the CPU), and both backends run the same
// formula.
//
// Every multiply-add here is an explicit fmaf, one rounding each, so the result does not depend
// on whether a compiler fuses `a * b + c` on its own (GCC and nvcc do by default, clang only
// within one expression): the CPU oracle and the GPU compute the same bits. fmaf is one
// instruction wherever the target has FMA (x86-64 with -march=native, every CUDA GPU).
MIXPREC_HD float tanh_rational(float x) {
  constexpr float kClamp = 7.90531110763549805f;
  const float xc = x > kClamp ? kClamp : (x < -kClamp ? -kClamp : x);
  const float x2 = xc * xc;
  float p = -2.76076847742355e-16f;
  p = fmaf(p, x2, 2.00018790482477e-13f);
  p = fmaf(p, x2, -8.60467152213735e-11f);
  p = fmaf(p, x2, 5.12229709037114e-08f);
  p = fmaf(p, x2, 1.48572235717979e-05f);
  p = fmaf(p, x2, 6.37261928875436e-04f);
  p = fmaf(p, x2, 4.89352455891786e-03f);
  float q = 1.19825839466702e-06f;
  q = fmaf(q, x2, 1.18534705686654e-04f);
  q = fmaf(q, x2, 2.26843463243900e-03f);
  q = fmaf(q, x2, 4.89352518554385e-03f);
  const float t = xc * p / q;
  const float bounded = t > 1.0f ? 1.0f : (t < -1.0f ? -1.0f : t);
  // At the clamp the rational is within an ulp of 1 either side; saturating explicitly makes
  // 1 - t^2 exactly 0 in gelu_tanh_derivative's far tails.
  const float saturated = fabsf(x) >= kClamp ? copysignf(1.0f, x) : bounded;
  return fabsf(x) < 4e-4f ? x : saturated;
}

// u = sqrt(2/pi) (x + 0.044715 x^3), the argument of gelu_tanh's tanh, with one rounding for
// x + c x^3 (see tanh_rational on explicit fmaf).
MIXPREC_HD float gelu_tanh_argument(float x) {
  return kGeluTanhScale * fmaf(kGeluTanhCubic * x * x, x, x);
}

// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
MIXPREC_HD float gelu_tanh(float x) {
  const float half_x = 0.5f * x;
  return fmaf(half_x, tanh_rational(gelu_tanh_argument(x)), half_x);
}

// The exact derivative of gelu_tanh:
// 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2), t = tanh(u).
MIXPREC_HD float gelu_tanh_derivative(float x) {
  const float t = tanh_rational(gelu_tanh_argument(x));
  const float du = kGeluTanhScale * fmaf(3.0f * kGeluTanhCubic * x, x, 1.0f);
  const float one_minus_t2 = fmaf(-t, t, 1.0f);
  return fmaf(0.5f * x * one_minus_t2, du, fmaf(0.5f, t, 0.5f));
}

// 1 / (1 + e^-x), evaluated so that exp never overflows: for x < 0 the equivalent
// e^x / (1 + e^x) is used.
MIXPREC_HD float stable_sigmoid(float x) {
  if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
  const float e = expf(x);
  return e / (1.0f + e);
}

template <UnaryOp Op>
MIXPREC_HD float unary_value(float x) {
  if constexpr (Op == UnaryOp::Exp) return expf(x);
  else if constexpr (Op == UnaryOp::Log) return logf(x);
  else if constexpr (Op == UnaryOp::Sqrt) return sqrtf(x);
  else if constexpr (Op == UnaryOp::Square) return x * x;
  else if constexpr (Op == UnaryOp::Relu) return x > 0.0f || x != x ? x : 0.0f;  // NaN stays
  else if constexpr (Op == UnaryOp::Gelu) return gelu_tanh(x);
  else if constexpr (Op == UnaryOp::Sigmoid) return stable_sigmoid(x);
  else {
    static_assert(Op == UnaryOp::Tanh, "unhandled UnaryOp");
    return tanh_rational(x);
  }
}

// The subgradient at the kink is relu'(0) = 0, as PyTorch. relu keeps a NaN (and passes its
// gradient), so a NaN upstream is never hidden from anomaly checks.
template <UnaryOp Op>
MIXPREC_HD float unary_grad(float x, float y, float dy) {
  if constexpr (Op == UnaryOp::Exp) return dy * y;
  else if constexpr (Op == UnaryOp::Log) return dy / x;
  else if constexpr (Op == UnaryOp::Sqrt) return dy * 0.5f / y;
  else if constexpr (Op == UnaryOp::Square) return 2.0f * x * dy;
  else if constexpr (Op == UnaryOp::Relu) return x > 0.0f || x != x ? dy : 0.0f;
  else if constexpr (Op == UnaryOp::Gelu) return dy * gelu_tanh_derivative(x);
  else if constexpr (Op == UnaryOp::Sigmoid) return dy * y * (1.0f - y);
  else {
    static_assert(Op == UnaryOp::Tanh, "unhandled UnaryOp");
    return dy * (1.0f - y * y);
  }
}

MIXPREC_HD bool unary_grad_reads_output(UnaryOp op) {
  return op == UnaryOp::Exp || op == UnaryOp::Sqrt || op == UnaryOp::Sigmoid ||
         op == UnaryOp::Tanh;
}

template <BinaryOp Op>
MIXPREC_HD float binary_value(float a, float b) {
  if constexpr (Op == BinaryOp::Add) return a + b;
  else if constexpr (Op == BinaryOp::Sub) return a - b;
  else if constexpr (Op == BinaryOp::Mul) return a * b;
  else {
    static_assert(Op == BinaryOp::Div, "unhandled BinaryOp");
    return a / b;
  }
}

// y = alpha * x + beta.
MIXPREC_HD float affine_value(float x, float alpha, float beta) { return alpha * x + beta; }

// Runtime-dispatched forms, for scalar code and tests.
MIXPREC_HD float unary_value(UnaryOp op, float x) {
  switch (op) {
    case UnaryOp::Exp: return unary_value<UnaryOp::Exp>(x);
    case UnaryOp::Log: return unary_value<UnaryOp::Log>(x);
    case UnaryOp::Sqrt: return unary_value<UnaryOp::Sqrt>(x);
    case UnaryOp::Square: return unary_value<UnaryOp::Square>(x);
    case UnaryOp::Relu: return unary_value<UnaryOp::Relu>(x);
    case UnaryOp::Gelu: return unary_value<UnaryOp::Gelu>(x);
    case UnaryOp::Sigmoid: return unary_value<UnaryOp::Sigmoid>(x);
    case UnaryOp::Tanh: return unary_value<UnaryOp::Tanh>(x);
  }
  return x;
}

MIXPREC_HD float unary_grad(UnaryOp op, float x, float y, float dy) {
  switch (op) {
    case UnaryOp::Exp: return unary_grad<UnaryOp::Exp>(x, y, dy);
    case UnaryOp::Log: return unary_grad<UnaryOp::Log>(x, y, dy);
    case UnaryOp::Sqrt: return unary_grad<UnaryOp::Sqrt>(x, y, dy);
    case UnaryOp::Square: return unary_grad<UnaryOp::Square>(x, y, dy);
    case UnaryOp::Relu: return unary_grad<UnaryOp::Relu>(x, y, dy);
    case UnaryOp::Gelu: return unary_grad<UnaryOp::Gelu>(x, y, dy);
    case UnaryOp::Sigmoid: return unary_grad<UnaryOp::Sigmoid>(x, y, dy);
    case UnaryOp::Tanh: return unary_grad<UnaryOp::Tanh>(x, y, dy);
  }
  return dy;
}

MIXPREC_HD float binary_value(BinaryOp op, float a, float b) {
  switch (op) {
    case BinaryOp::Add: return binary_value<BinaryOp::Add>(a, b);
    case BinaryOp::Sub: return binary_value<BinaryOp::Sub>(a, b);
    case BinaryOp::Mul: return binary_value<BinaryOp::Mul>(a, b);
    case BinaryOp::Div: return binary_value<BinaryOp::Div>(a, b);
  }
  return a;
}

}  // namespace mixprec
