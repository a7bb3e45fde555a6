// `mixprec explain formats` prints values computed by core/half.h. Each expected string below
// is the exact value that a correct round-to-nearest-even conversion gives; a wrong one
// (truncation, no subnormals, wrong overflow threshold) prints something else.
#include <catch2/catch.hpp>

#include <sstream>
#include <string>

#include "apps/explain/formats.h"

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The line of the worked-conversion table for FP16 or BF16 whose input column is `literal`.
std::string conversion_line(const std::string& text, const std::string& section,
                            const std::string& literal) {
  const size_t start = text.find(section);
  REQUIRE(start != std::string::npos);
  std::istringstream lines(text.substr(start));
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("  " + literal + " ", 0) == 0) return line;
  }
  FAIL("no line for " << literal << " in " << section);
  return {};
}

}  // namespace

TEST_CASE("explain formats: table of landmarks", "[apps][explain]") {
  const std::string text = mixprec::explain::explain_formats();
  INFO(text);
  // FP16
  CHECK(contains(text, "65504"));
  CHECK(contains(text, "6.103515625e-05"));         // 2^-14
  CHECK(contains(text, "5.9604644775390625e-08"));  // 2^-24
  CHECK(contains(text, "0.0009765625"));            // 2^-10
  CHECK(contains(text, "0x7BFF"));
  // BF16
  CHECK(contains(text, "3.3895313892515355e+38"));  // 0x7F7F
  CHECK(contains(text, "9.1835496157991212e-41"));  // 2^-133
  CHECK(contains(text, "0.0078125"));               // 2^-7
  // FP32
  CHECK(contains(text, "3.4028234663852886e+38"));
  CHECK(contains(text, "1.1754943508222875e-38"));
  CHECK(contains(text, "1.4012984643248171e-45"));
  CHECK(contains(text, "1.1920928955078125e-07"));
  // Biases and decimal digits
  CHECK(contains(text, "127"));
  CHECK(contains(text, "7.22"));
  CHECK(contains(text, "3.31"));
  CHECK(contains(text, "2.41"));
}

TEST_CASE("explain formats: worked FP16 conversions", "[apps][explain]") {
  const std::string text = mixprec::explain::explain_formats();
  const std::string section = "FP32 -> FP16";

  const std::string tiny = conversion_line(text, section, "1e-08");
  INFO(tiny);
  CHECK(contains(tiny, "0 00000 0000000000  0x0000"));
  CHECK(contains(tiny, "underflow"));

  // 3e-8 is above half the smallest subnormal, so it rounds up to it instead of to zero.
  const std::string small = conversion_line(text, section, "3e-08");
  INFO(small);
  CHECK(contains(small, "0x0001"));
  CHECK(contains(small, "5.9604644775390625e-08"));

  const std::string normal = conversion_line(text, section, "0.00016384");
  INFO(normal);
  CHECK(contains(normal, "0.00016379356384277344"));
  CHECK(contains(normal, "0x095E"));

  const std::string below_midpoint = conversion_line(text, section, "65519");
  INFO(below_midpoint);
  CHECK(contains(below_midpoint, "0x7BFF"));
  CHECK(contains(below_midpoint, " 65504 "));

  const std::string midpoint = conversion_line(text, section, "65520");
  INFO(midpoint);
  CHECK(contains(midpoint, "0 11111 0000000000  0x7C00"));
  CHECK(contains(midpoint, "inf"));
  CHECK(contains(midpoint, "overflow"));

  // A tie between 1 and the next FP16 goes to the even mantissa, 1.
  const std::string tie = conversion_line(text, section, "1+2^-11");
  INFO(tie);
  CHECK(contains(tie, "0x3C00"));

  const std::string integer = conversion_line(text, section, "2049");
  INFO(integer);
  CHECK(contains(integer, " 2048 "));
}

TEST_CASE("explain formats: worked BF16 conversions", "[apps][explain]") {
  const std::string text = mixprec::explain::explain_formats();
  const std::string section = "FP32 -> BF16";

  // BF16 keeps FP32's exponent range: 65520 is finite and 1e-8 is a normal number.
  const std::string big = conversion_line(text, section, "65520");
  INFO(big);
  CHECK(contains(big, "0x4780"));
  CHECK(contains(big, " 65536 "));
  CHECK_FALSE(contains(big, "inf"));

  const std::string tiny = conversion_line(text, section, "1e-08");
  INFO(tiny);
  CHECK(contains(tiny, "0x322C"));
  CHECK(contains(tiny, "1.0011717677116394e-08"));

  // 257 is the midpoint of 256 and 258; ties go to the even mantissa.
  const std::string tie = conversion_line(text, section, "257");
  INFO(tie);
  CHECK(contains(tie, " 256 "));

  const std::string pi = conversion_line(text, section, "3.14159265");
  INFO(pi);
  CHECK(contains(pi, "0x4049"));
  CHECK(contains(pi, " 3.140625 "));
}

TEST_CASE("bit_fields splits sign, exponent and mantissa", "[apps][explain]") {
  using namespace mixprec::explain;
  CHECK(bit_fields(fp16_format(), 0x7BFF) == "0 11110 1111111111");
  CHECK(bit_fields(bf16_format(), 0xFF80) == "1 11111111 0000000");
  CHECK(bit_fields(fp32_format(), 0x3F800000) == "0 01111111 00000000000000000000000");
}
