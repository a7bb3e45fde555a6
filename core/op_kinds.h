// The op kinds that Backend primitives are parameterised by. Kept apart from core/backend.h
// so that the per-element math shared with CUDA kernels (core/math/) needs nothing else.
#pragma once

#include <cstdint>

namespace mixprec {

enum class UnaryOp : uint8_t { Exp, Log, Sqrt, Square, Relu, Gelu, Sigmoid, Tanh };
enum class BinaryOp : uint8_t { Add, Sub, Mul, Div };
enum class PoolKind : uint8_t { Max, Avg };

}  // namespace mixprec
