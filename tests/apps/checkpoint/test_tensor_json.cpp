// Tensors in JSON: the base64 text is checked against hand-encoded bytes, round trips are
// compared bit for bit, and every malformed field is an Error naming the tensor.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/checkpoint/tensor_json.h"
#include "core/error.h"
#include "tests/tensor_bytes.h"

using mixprec_test::raw_bytes;
using mixprec_test::tensor_from_bytes;

namespace {

using Catch::Matchers::Contains;
using mixprec::DType;
using mixprec::Tensor;

std::string from_json_error(const nlohmann::json& value) {
  try {
    mixprec::tensor_from_json(value, "optimizer.exp_avg.3");
  } catch (const mixprec::Error& e) {
    return e.what();
  }
  FAIL("tensor_from_json(" << value.dump() << ") did not throw");
  return {};
}

}  // namespace

TEST_CASE("tensor_json: known values encode to hand-computed base64", "[apps][checkpoint]") {
  // 1.0f = bytes 00 00 80 3F: 000000 000000 100000 001111 | 11(0000) -> "AACA" "Pw==".
  const nlohmann::json f32 = mixprec::tensor_to_json(Tensor::from_vector({1.0f}, {1}));
  CHECK(f32 == nlohmann::json{{"dtype", "F32"}, {"shape", {1}}, {"data", "AACAPw=="}});
  // FP16 1.0 = bytes 00 3C: 000000 000011 1100(00) -> "ADw=".
  const nlohmann::json f16 = mixprec::tensor_to_json(Tensor::from_vector({1.0f}, {}, DType::F16));
  CHECK(f16 ==
        nlohmann::json{{"dtype", "F16"}, {"shape", nlohmann::json::array()}, {"data", "ADw="}});
  // Three bytes need no padding: I32 values 1 and 2 are 01 00 00 00 02 00 00 00.
  // 01 00 00 -> 000000 010000 000000 000000 = "AQAA"; 00 02 00 -> "AAIA"; 00 00 -> "AAA=".
  const nlohmann::json i32 = mixprec::tensor_to_json(Tensor::from_ints({1, 2}, {2, 1}));
  CHECK(i32 == nlohmann::json{{"dtype", "I32"}, {"shape", {2, 1}}, {"data", "AQAAAAIAAAA="}});
  // BF16 -2.0 = 0xC000 = bytes 00 C0: 000000 001100 0000(00) -> "AMA=".
  const nlohmann::json bf16 =
      mixprec::tensor_to_json(Tensor::from_vector({-2.0f}, {1}, DType::BF16));
  CHECK(bf16["data"] == "AMA=");
  // An empty tensor has empty data.
  CHECK(mixprec::tensor_to_json(Tensor::zeros({0, 3}))["data"] == "");
}

TEST_CASE("tensor_json: hand-written JSON decodes to the right bytes", "[apps][checkpoint]") {
  const Tensor t =
      mixprec::tensor_from_json({{"dtype", "F32"}, {"shape", {2}}, {"data", "AACAPwAAAMA="}}, "t");
  CHECK(t.dtype() == DType::F32);
  CHECK(t.shape() == mixprec::Shape{2});
  CHECK(t.to_float_vector() == std::vector<float>{1.0f, -2.0f});
}

TEST_CASE("tensor_json: round trip of every dtype is bit-exact", "[apps][checkpoint]") {
  const std::vector<Tensor> tensors = {
      // F32: 1.0, -0.0, NaN with payload, smallest subnormal, -inf (6 values, 24 bytes).
      tensor_from_bytes({0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x00, 0x80, 0x23, 0x01, 0xC0, 0x7F,
                         0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x80, 0xFF, 0xDB, 0x0F, 0x49, 0x40},
                        {2, 3}, DType::F32),
      // F16 and BF16 with odd byte counts mod 3 (10 and 4 bytes).
      tensor_from_bytes({0x00, 0x3C, 0x00, 0x80, 0x01, 0x7E, 0x01, 0x00, 0xFF, 0x7B}, {5},
                        DType::F16),
      tensor_from_bytes({0x80, 0x3F, 0xC1, 0xFF}, {1, 2}, DType::BF16),
      Tensor::from_ints(
          {0, -1, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()}, {4}),
      Tensor::scalar(3.25),                // 0-dim
      Tensor::empty({2, 0}, DType::BF16),  // no data
  };
  for (const Tensor& original : tensors) {
    INFO(mixprec::describe(original));
    // Through the JSON text, as state.json stores it.
    const nlohmann::json text = nlohmann::json::parse(mixprec::tensor_to_json(original).dump());
    const Tensor back = mixprec::tensor_from_json(text, "t");
    CHECK(back.dtype() == original.dtype());
    CHECK(back.shape() == original.shape());
    CHECK(raw_bytes(back) == raw_bytes(original));
  }
}

TEST_CASE("tensor_json: malformed values are errors naming the tensor", "[apps][checkpoint]") {
  const nlohmann::json good = {{"dtype", "F32"}, {"shape", {2}}, {"data", "AACAPwAAAMA="}};
  const auto with = [&](const std::string& key, const nlohmann::json& value) {
    nlohmann::json out = good;
    out[key] = value;
    return out;
  };

  SECTION("not an object") {
    CHECK_THAT(from_json_error(nlohmann::json::array()), Contains("optimizer.exp_avg.3"));
  }
  SECTION("missing fields") {
    for (const std::string key : {"dtype", "shape", "data"}) {
      nlohmann::json value = good;
      value.erase(key);
      CHECK_THAT(from_json_error(value), Contains("optimizer.exp_avg.3") && Contains(key));
    }
  }
  SECTION("fields of the wrong type") {
    CHECK_THAT(from_json_error(with("dtype", 3)), Contains("optimizer.exp_avg.3"));
    CHECK_THAT(from_json_error(with("shape", 2)), Contains("optimizer.exp_avg.3"));
    CHECK_THAT(from_json_error(with("data", nlohmann::json::array())),
               Contains("optimizer.exp_avg.3"));
  }
  SECTION("unknown dtype") {
    CHECK_THAT(from_json_error(with("dtype", "F64")),
               Contains("optimizer.exp_avg.3") && Contains("F64"));
  }
  SECTION("bad shape extents") {
    CHECK_THAT(from_json_error(with("shape", {-2})), Contains("optimizer.exp_avg.3"));
    CHECK_THAT(from_json_error(with("shape", {2.0})), Contains("optimizer.exp_avg.3"));
    CHECK_THAT(from_json_error(with("shape", {"2"})), Contains("optimizer.exp_avg.3"));
  }
  SECTION("bad base64") {
    // Length not a multiple of 4, a character outside the alphabet, padding in the middle,
    // too much padding, data after padding.
    for (const std::string data : {"AACAPwAAAMA", "AACA*wAAAMA=", "AA==AAAAAAAA",
                                   "AACAPwAAA===", "AACAPw==AMA=", "AACAPwAA AMA"}) {
      INFO(data);
      CHECK_THAT(from_json_error(with("data", data)),
                 Contains("optimizer.exp_avg.3") && Contains("base64"));
    }
  }
  SECTION("wrong byte count") {
    // 7 bytes for 8 expected, and 9 for 8.
    CHECK_THAT(from_json_error(with("data", "AACAPwAAAA==")),
               Contains("optimizer.exp_avg.3") && Contains("7 bytes"));
    CHECK_THAT(from_json_error(with("data", "AACAPwAAAMAA")),
               Contains("optimizer.exp_avg.3") && Contains("9 bytes"));
  }
  SECTION("a huge shape is an error, not an allocation") {
    CHECK_THAT(from_json_error(with("shape", {1000000000, 1000000000})),
               Contains("optimizer.exp_avg.3"));
    CHECK_THAT(from_json_error(with("shape", {int64_t{1} << 40, int64_t{1} << 40})),
               Contains("optimizer.exp_avg.3"));
  }
}

TEST_CASE("tensor_json: json_excerpt quotes short values and bounds long and deep ones",
          "[apps][checkpoint]") {
  CHECK(mixprec::json_excerpt(3) == "3");
  CHECK(mixprec::json_excerpt("F64") == "\"F64\"");
  CHECK(mixprec::json_excerpt(nlohmann::json::parse("[1, [2], {\"a\": null}]")) ==
        "[1,[2],{\"a\":null}]");
  // 300 letters dump to 302 characters: the first 120 are kept, then "...".
  CHECK(mixprec::json_excerpt(std::string(300, 'a')) == "\"" + std::string(119, 'a') + "...");
  // The cut would split "é" (C3 A9, at characters 119 and 120), so it moves before it.
  CHECK(mixprec::json_excerpt(std::string(118, 'a') + "\xC3\xA9" + "bcd") ==
        "\"" + std::string(118, 'a') + "...");
  // 16 levels are quoted, 17 are not.
  CHECK(mixprec::json_excerpt(nlohmann::json::parse(std::string(16, '[') + std::string(16, ']'))) ==
        std::string(16, '[') + std::string(16, ']'));
  CHECK(mixprec::json_excerpt(nlohmann::json::parse(std::string(17, '[') + std::string(17, ']'))) ==
        "an array nested more than 16 levels deep");
  CHECK(mixprec::json_excerpt(nlohmann::json::parse(R"({"a":)" + std::string(20, '[') +
                                                    std::string(20, ']') + "}")) ==
        "an object nested more than 16 levels deep");
}

TEST_CASE("tensor_json: json_nested_within counts the levels of arrays and objects",
          "[apps][checkpoint]") {
  CHECK(mixprec::json_nested_within(5, 0));
  CHECK(mixprec::json_nested_within("text", 0));
  CHECK_FALSE(mixprec::json_nested_within(nlohmann::json::array(), 0));
  CHECK(mixprec::json_nested_within(nlohmann::json::array(), 1));
  const nlohmann::json two = nlohmann::json::parse(R"({"a": [1], "b": 2})");
  CHECK_FALSE(mixprec::json_nested_within(two, 1));
  CHECK(mixprec::json_nested_within(two, 2));
  // The deepest branch counts, wherever it is.
  const nlohmann::json mixed = nlohmann::json::parse(R"([1, [2], [[3]], 4])");
  CHECK_FALSE(mixprec::json_nested_within(mixed, 2));
  CHECK(mixprec::json_nested_within(mixed, 3));
}

// The error for a bad extent quotes it; quoting one nested 200000 levels deep with dump()
// recursed once per level and overflowed the stack.
TEST_CASE("tensor_json: an extent nested 200000 levels deep is an Error, not a crash",
          "[apps][checkpoint]") {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  const nlohmann::json value =
      nlohmann::json::parse(R"({"dtype": "F32", "data": "", "shape": [)" + deep + "]}");
  CHECK_THROWS_WITH(mixprec::tensor_from_json(value, "optimizer.exp_avg.3"),
                    Contains("optimizer.exp_avg.3") &&
                        Contains("an array nested more than 16 levels deep"));
}
