#include "core/dtype.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"

namespace mixprec {

DType parse_dtype(std::string_view name) {
  std::string s(name);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "f32" || s == "fp32" || s == "float32" || s == "float") return DType::F32;
  if (s == "f16" || s == "fp16" || s == "float16" || s == "half") return DType::F16;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  if (s == "i32" || s == "int32") return DType::I32;
  MIXPREC_FAIL("unknown dtype '", name, "' (expected fp32, fp16, bf16 or i32)");
}

}  // namespace mixprec
