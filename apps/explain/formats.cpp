#include "apps/explain/formats.h"

#include <bit>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "apps/explain/topics.h"
#include "core/error.h"
#include "core/half.h"

namespace mixprec::explain {
namespace {

uint32_t fp32_encode(float value) { return std::bit_cast<uint32_t>(value); }
float fp32_decode(uint32_t bits) { return std::bit_cast<float>(bits); }
uint32_t fp16_encode(float value) { return float_to_half_bits(value); }
float fp16_decode(uint32_t bits) { return half_bits_to_float(static_cast<uint16_t>(bits)); }
uint32_t bf16_encode(float value) { return float_to_bf16_bits(value); }
float bf16_decode(uint32_t bits) { return bf16_bits_to_float(static_cast<uint16_t>(bits)); }

// Left-aligns `text` in a column of `width`, always leaving one space before the next column.
std::string pad(std::string text, size_t width) {
  text.append(text.size() < width ? width - text.size() : 1, ' ');
  return text;
}

// What rounding did to `input`, in words, judged from the values themselves.
std::string outcome(const FloatFormat& f, float input, uint32_t bits) {
  const float result = f.decode(bits);
  const uint32_t magnitude = bits & ((1u << (f.exponent_bits + f.mantissa_bits)) - 1u);
  if (result == input) {
    return magnitude != 0 && magnitude < (1u << f.mantissa_bits) ? "exact (subnormal)" : "exact";
  }
  if (result == 0.0f) return "underflow: rounded to zero";
  if (std::isinf(result)) return "overflow: rounded to infinity";
  const double error = std::fabs(static_cast<double>(result) - input);
  // The representable neighbour on the input's other side; at equal distance the input was a
  // tie, which round-to-nearest-even settles by the last mantissa bit.
  const uint32_t neighbour_magnitude =
      std::fabs(input) > std::fabs(result) ? magnitude + 1u : magnitude - 1u;
  const float neighbour = f.decode((bits & ~((1u << (f.exponent_bits + f.mantissa_bits)) - 1u)) |
                                   neighbour_magnitude);
  const bool tie = std::isfinite(neighbour) &&
                   std::fabs(static_cast<double>(neighbour) - input) == error;
  char text[128];
  std::snprintf(text, sizeof text, "%srounded%s, relative error %.2g",
                magnitude < (1u << f.mantissa_bits) ? "subnormal, " : "",
                tie ? " (a tie, to even)" : "",
                error / std::fabs(static_cast<double>(input)));
  return text;
}

struct Example {
  const char* literal;  // the decimal the reader would type
  float value;
};

void append_conversions(std::string& out, const FloatFormat& f, const std::vector<Example>& examples) {
  const size_t bits_width = 3 + f.exponent_bits + f.mantissa_bits;
  out += "  " + pad("x", 12) + pad("x as FP32", 25) + pad(std::string(f.name) + "(x) sign exp mantissa", bits_width + 10) +
         pad("value", 25) + "what happened\n";
  for (const Example& e : examples) {
    const uint32_t bits = f.encode(e.value);
    out += "  " + pad(e.literal, 12) + pad(exact_text(e.value), 25) +
           pad(bit_fields(f, bits) + "  " + hex_pattern(f, bits), bits_width + 10) +
           pad(exact_text(f.decode(bits)), 25) + outcome(f, e.value, bits) + "\n";
  }
}

}  // namespace

const FloatFormat& fp32_format() {
  static const FloatFormat format{"FP32", 8, 23, fp32_encode, fp32_decode};
  return format;
}
const FloatFormat& fp16_format() {
  static const FloatFormat format{"FP16", 5, 10, fp16_encode, fp16_decode};
  return format;
}
const FloatFormat& bf16_format() {
  static const FloatFormat format{"BF16", 8, 7, bf16_encode, bf16_decode};
  return format;
}

std::string hex_pattern(const FloatFormat& format, uint32_t bits) {
  char text[16];
  const int digits = (1 + format.exponent_bits + format.mantissa_bits) / 4;
  std::snprintf(text, sizeof text, "0x%0*X", digits, bits);
  return text;
}

std::string bit_fields(const FloatFormat& format, uint32_t bits) {
  const int total = 1 + format.exponent_bits + format.mantissa_bits;
  std::string text;
  for (int i = total - 1; i >= 0; --i) {
    text += ((bits >> i) & 1u) ? '1' : '0';
    if (i == total - 1 || i == format.mantissa_bits) text += ' ';
  }
  return text;
}

FormatLandmarks format_landmarks(const FloatFormat& f) {
  const uint32_t m = static_cast<uint32_t>(f.mantissa_bits);
  const uint32_t exponent_all_ones = (1u << f.exponent_bits) - 1u;
  FormatLandmarks l;
  // The bias is read off the encoding of 1.0 = 2^0, whose exponent field holds the bias.
  l.one_bits = f.encode(1.0f);
  l.bias = l.one_bits >> m;
  MIXPREC_CHECK(l.one_bits == (l.bias << m) && l.bias == exponent_all_ones / 2, f.name,
                ": 1.0 encodes as ", hex_pattern(f, l.one_bits), ", not as bias << mantissa bits");
  l.largest_finite_bits = ((exponent_all_ones - 1u) << m) | ((1u << m) - 1u);
  l.smallest_normal_bits = 1u << m;
  l.smallest_subnormal_bits = 1u;
  l.infinity_bits = exponent_all_ones << m;
  MIXPREC_CHECK(f.encode(INFINITY) == l.infinity_bits && std::isinf(f.decode(l.infinity_bits)),
                f.name, ": infinity does not round-trip through ", hex_pattern(f, l.infinity_bits));
  for (uint32_t bits : {l.largest_finite_bits, l.smallest_normal_bits, l.smallest_subnormal_bits}) {
    MIXPREC_CHECK(f.encode(f.decode(bits)) == bits, f.name, ": ", hex_pattern(f, bits),
                  " does not round-trip through float");
  }
  l.largest_finite = f.decode(l.largest_finite_bits);
  l.smallest_normal = f.decode(l.smallest_normal_bits);
  l.smallest_subnormal = f.decode(l.smallest_subnormal_bits);
  l.epsilon = static_cast<double>(f.decode(l.one_bits + 1u)) - 1.0;
  return l;
}

std::string explain_formats() {
  const FloatFormat* formats[] = {&fp32_format(), &fp16_format(), &bf16_format()};
  FormatLandmarks marks[3];
  for (int i = 0; i < 3; ++i) marks[i] = format_landmarks(*formats[i]);

  std::string out;
  out +=
      "Floating-point formats used in mixed-precision training\n"
      "=======================================================\n"
      "\n"
      "A bit pattern [sign | exponent e | mantissa m] means\n"
      "  normal    (0 < e < all ones):  (-1)^sign * 1.m * 2^(e - bias)\n"
      "  subnormal (e = 0):             (-1)^sign * 0.m * 2^(1 - bias)\n"
      "  e = all ones:                  infinity (m = 0) or NaN (m != 0)\n"
      "Every value below is decoded from its bit pattern, or rounded to it, by mixprec's own\n"
      "conversions (core/half.h: round to nearest, ties to even, with subnormals).\n"
      "\n";

  constexpr size_t kLabel = 34;
  constexpr size_t kColumn = 25;
  auto row = [&](const std::string& label, auto cell) {
    std::string line = pad(label, kLabel);
    for (int i = 0; i < 3; ++i) line += pad(cell(*formats[i], marks[i]), kColumn);
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  };
  row("", [](const FloatFormat& f, const FormatLandmarks&) { return std::string(f.name); });
  row("bits: sign / exponent / mantissa", [](const FloatFormat& f, const FormatLandmarks&) {
    return "1 / " + std::to_string(f.exponent_bits) + " / " + std::to_string(f.mantissa_bits);
  });
  row("exponent bias", [](const FloatFormat&, const FormatLandmarks& l) { return std::to_string(l.bias); });
  row("largest finite", [](const FloatFormat&, const FormatLandmarks& l) {
    return exact_text(l.largest_finite);
  });
  row("  bit pattern", [](const FloatFormat& f, const FormatLandmarks& l) {
    return hex_pattern(f, l.largest_finite_bits);
  });
  row("smallest normal", [](const FloatFormat&, const FormatLandmarks& l) {
    return exact_text(l.smallest_normal);
  });
  row("  bit pattern", [](const FloatFormat& f, const FormatLandmarks& l) {
    return hex_pattern(f, l.smallest_normal_bits);
  });
  row("smallest subnormal", [](const FloatFormat&, const FormatLandmarks& l) {
    return exact_text(l.smallest_subnormal);
  });
  row("  bit pattern", [](const FloatFormat& f, const FormatLandmarks& l) {
    return hex_pattern(f, l.smallest_subnormal_bits);
  });
  row("machine epsilon", [](const FloatFormat&, const FormatLandmarks& l) {
    return exact_text(l.epsilon);
  });
  row("decimal digits", [](const FloatFormat& f, const FormatLandmarks&) {
    char text[16];
    std::snprintf(text, sizeof text, "%.2f", (f.mantissa_bits + 1) * std::log10(2.0));
    return std::string(text);
  });
  row("integers exact up to", [](const FloatFormat& f, const FormatLandmarks& l) {
    // 2^(m+1): the first power of two whose ulp is 2, so the next integer is skipped.
    const uint32_t bits = (l.bias + static_cast<uint32_t>(f.mantissa_bits) + 1u)
                          << f.mantissa_bits;
    return exact_text(f.decode(bits));
  });

  out +=
      "\n"
      "largest finite      exponent all ones but the last bit, mantissa all ones. Anything at or\n"
      "                    past the midpoint to the next power of two rounds to infinity.\n"
      "smallest normal     2^(1 - bias). Below it the leading 1 is gone and precision falls off\n"
      "                    one bit per halving (gradual underflow).\n"
      "smallest subnormal  2^(1 - bias - mantissa bits). Below half of it a value becomes 0.\n"
      "machine epsilon     2^-(mantissa bits): the gap after 1. Rounding a number in range makes\n"
      "                    a relative error of at most half of it.\n"
      "decimal digits      (mantissa bits + 1) * log10(2): significant decimal digits carried.\n"
      "\n";

  out += "Worked conversions: FP32 -> FP16\n";
  const float fp16_tie = 1.0f + std::ldexp(1.0f, -11);  // exactly halfway between 1 and 1+2^-10
  append_conversions(out, fp16_format(),
                     {{"1", 1.0f},
                      {"0.1", 0.1f},
                      {"1+2^-11", fp16_tie},
                      {"2049", 2049.0f},
                      {"0.00016384", 0.00016384f},
                      {"6e-05", 6e-05f},
                      {"3e-08", 3e-08f},
                      {"1e-08", 1e-08f},
                      {"65504", 65504.0f},
                      {"65519", 65519.0f},
                      {"65520", 65520.0f}});
  out += "\nWorked conversions: FP32 -> BF16\n";
  append_conversions(out, bf16_format(),
                     {{"1", 1.0f},
                      {"0.1", 0.1f},
                      {"3.14159265", 3.14159265f},
                      {"257", 257.0f},
                      {"1e-08", 1e-08f},
                      {"65519", 65519.0f},
                      {"65520", 65520.0f},
                      {"3e+38", 3e+38f}});

  const FormatLandmarks& h = marks[1];
  out += "\nWhy it matters\n";
  out += "  FP16 has no positive value below " + exact_text(h.smallest_subnormal) +
         " and no finite value above " + exact_text(h.largest_finite) +
         ".\n"
         "  Activation gradients are often smaller than the first: in FP16 they become 0 and\n"
         "  the weights stop learning. Loss scaling multiplies the loss by S before backward,\n"
         "  so every gradient is S times larger and lands inside the FP16 range; the FP32\n"
         "  gradients are divided by S before the optimizer step, and a step whose gradients\n"
         "  overflowed to inf is skipped.\n"
         "  BF16 keeps FP32's exponent, so it rarely underflows and needs no scaling, but it\n"
         "  carries only " +
         std::to_string(bf16_format().mantissa_bits + 1) + " significant bits: its next value after 1 is 1 + " +
         exact_text(marks[2].epsilon) +
         ".\n"
         "  So weights are kept and updated in FP32 (master weights), where small updates are\n"
         "  not rounded away.\n";
  return out;
}

LessonJson explain_formats_json() {
  LessonJson lesson = LessonJson::object();
  const std::pair<const char*, const FloatFormat*> formats[] = {
      {"fp16", &fp16_format()}, {"bf16", &bf16_format()}, {"fp32", &fp32_format()}};
  for (const auto& [prefix, format] : formats) {
    const FormatLandmarks l = format_landmarks(*format);
    const std::string p = prefix;
    lesson[p + "_max"] = l.largest_finite;
    lesson[p + "_min_normal"] = l.smallest_normal;
    lesson[p + "_min_subnormal"] = l.smallest_subnormal;
    lesson[p + "_epsilon"] = l.epsilon;
  }
  return lesson;
}

}  // namespace mixprec::explain
