// `mixprec explain formats`: a lesson on the FP32, FP16 and BF16 number formats.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "apps/explain/lesson_json.h"

namespace mixprec::explain {

// A binary floating-point format with one sign bit, described by its field widths and by the
// framework's conversions to and from FP32.
struct FloatFormat {
  std::string_view name;          // "FP32", "FP16", "BF16"
  int exponent_bits = 0;
  int mantissa_bits = 0;          // stored bits, without the implicit leading one
  uint32_t (*encode)(float) = nullptr;  // float -> bit pattern, round-to-nearest-even
  float (*decode)(uint32_t) = nullptr;  // bit pattern -> float, exact
};

// FP32 (identity conversions), FP16 and BF16 (core/half.h).
const FloatFormat& fp32_format();
const FloatFormat& fp16_format();
const FloatFormat& bf16_format();

// "0x7BFF": `bits` in hexadecimal, one digit per four bits of the format.
std::string hex_pattern(const FloatFormat& format, uint32_t bits);

// A format's landmarks: the bit patterns derived from its field widths, and their values
// decoded by the format's own conversion. Throws mixprec::Error if the conversions contradict
// the format's definition (e.g. 1.0 does not encode as bias << mantissa_bits, or a landmark
// does not round-trip).
struct FormatLandmarks {
  uint32_t bias = 0;
  uint32_t one_bits = 0;                 // the pattern of 1.0
  uint32_t largest_finite_bits = 0;      // exponent all ones but the last bit, mantissa all ones
  uint32_t smallest_normal_bits = 0;     // exponent 1, mantissa 0
  uint32_t smallest_subnormal_bits = 0;  // exponent 0, mantissa 1
  uint32_t infinity_bits = 0;
  double largest_finite = 0.0;
  double smallest_normal = 0.0;
  double smallest_subnormal = 0.0;
  double epsilon = 0.0;                  // the gap between 1 and the next value
};
FormatLandmarks format_landmarks(const FloatFormat& format);

// "0 11110 1111111111": the sign, exponent and mantissa fields of `bits`, most significant
// first.
std::string bit_fields(const FloatFormat& format, uint32_t bits);

// The full lesson: a table of each format's field widths, bias, largest finite, smallest
// normal and subnormal values, machine epsilon and decimal digits, then worked conversions
// of chosen values to FP16 and BF16 with their bit patterns. Every number is decoded from a
// bit pattern or rounded by the conversions above, never typed in, so the text is also a
// check of those conversions. Values are printed with 17 significant digits, which is
// enough to tell apart every double and shows these values exactly. Throws mixprec::Error if
// the conversions contradict the format's definition (e.g. 1.0 does not encode as
// bias << mantissa_bits).
std::string explain_formats();

// The landmarks of the table as one JSON object: fp16_max, fp16_min_normal,
// fp16_min_subnormal, fp16_epsilon, and the same for bf16_ and fp32_ (numbers, from
// format_landmarks).
LessonJson explain_formats_json();

}  // namespace mixprec::explain
