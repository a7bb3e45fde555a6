// Element types of a Tensor. F16/BF16 are stored as 16-bit patterns (see core/half.h) and
// always computed in FP32 (load, convert, compute, round once on store).
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

namespace mixprec {

enum class DType : uint8_t { F32, F16, BF16, I32 };

constexpr size_t dtype_size(DType t) {
  return t == DType::F16 || t == DType::BF16 ? 2 : 4;
}
constexpr bool is_floating(DType t) { return t != DType::I32; }
constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I32: return "I32";
  }
  return "?";
}
// Parses "f32"/"fp32"/"float32", "f16"/"fp16"/"float16"/"half", "bf16"/"bfloat16", "i32"/"int32".
DType parse_dtype(std::string_view name);

inline std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

}  // namespace mixprec
