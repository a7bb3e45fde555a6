// A runtime op kind as a compile-time constant: with_unary_op(op, f) calls
// f(std::integral_constant<UnaryOp, op>{}), so that each backend instantiates one branch-free
// kernel per op from a single switch (likewise with_binary_op).
#pragma once

#include <type_traits>

#include "core/error.h"
#include "core/op_kinds.h"

namespace mixprec {

template <class F>
void with_unary_op(UnaryOp op, const F& f) {
  using U = UnaryOp;
  switch (op) {
    case U::Exp: return f(std::integral_constant<U, U::Exp>{});
    case U::Log: return f(std::integral_constant<U, U::Log>{});
    case U::Sqrt: return f(std::integral_constant<U, U::Sqrt>{});
    case U::Square: return f(std::integral_constant<U, U::Square>{});
    case U::Relu: return f(std::integral_constant<U, U::Relu>{});
    case U::Gelu: return f(std::integral_constant<U, U::Gelu>{});
    case U::Sigmoid: return f(std::integral_constant<U, U::Sigmoid>{});
    case U::Tanh: return f(std::integral_constant<U, U::Tanh>{});
  }
  MIXPREC_FAIL("unary: unknown UnaryOp ", static_cast<int>(op));
}

template <class F>
void with_binary_op(BinaryOp op, const F& f) {
  using B = BinaryOp;
  switch (op) {
    case B::Add: return f(std::integral_constant<B, B::Add>{});
    case B::Sub: return f(std::integral_constant<B, B::Sub>{});
    case B::Mul: return f(std::integral_constant<B, B::Mul>{});
    case B::Div: return f(std::integral_constant<B, B::Div>{});
  }
  MIXPREC_FAIL("binary: unknown BinaryOp ", static_cast<int>(op));
}

}  // namespace mixprec
