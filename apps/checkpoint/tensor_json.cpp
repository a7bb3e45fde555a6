// Tensors inside JSON as base64 of their bytes: exact, and readable by any JSON tool.
#include "apps/checkpoint/tensor_json.h"

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"

namespace mixprec {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64_encode(const uint8_t* bytes, size_t size) {
  std::string out;
  out.reserve((size + 2) / 3 * 4);
  for (size_t i = 0; i < size; i += 3) {
    const uint32_t b0 = bytes[i];
    const uint32_t b1 = i + 1 < size ? bytes[i + 1] : 0;
    const uint32_t b2 = i + 2 < size ? bytes[i + 2] : 0;
    const uint32_t triple = (b0 << 16) | (b1 << 8) | b2;
    out += kAlphabet[(triple >> 18) & 63];
    out += kAlphabet[(triple >> 12) & 63];
    out += i + 1 < size ? kAlphabet[(triple >> 6) & 63] : '=';
    out += i + 2 < size ? kAlphabet[triple & 63] : '=';
  }
  return out;
}

std::vector<uint8_t> base64_decode(const std::string& text, const std::string& what) {
  std::array<int, 256> value{};
  value.fill(-1);
  for (int i = 0; i < 64; ++i) value[static_cast<uint8_t>(kAlphabet[i])] = i;
  MIXPREC_CHECK(text.size() % 4 == 0, what, ": base64 data has length ", text.size(),
                ", not a multiple of 4");
  std::vector<uint8_t> out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    int quad[4];
    int padding = 0;
    for (int j = 0; j < 4; ++j) {
      const char c = text[i + j];
      if (c == '=' && i + 4 == text.size() && j >= 2) {
        quad[j] = 0;
        ++padding;
        continue;
      }
      MIXPREC_CHECK(padding == 0 && value[static_cast<uint8_t>(c)] >= 0, what,
                    ": invalid base64 character at offset ", i + j);
      quad[j] = value[static_cast<uint8_t>(c)];
    }
    const uint32_t triple = (quad[0] << 18) | (quad[1] << 12) | (quad[2] << 6) | quad[3];
    out.push_back(static_cast<uint8_t>(triple >> 16));
    if (padding < 2) out.push_back(static_cast<uint8_t>(triple >> 8));
    if (padding < 1) out.push_back(static_cast<uint8_t>(triple));
  }
  return out;
}

constexpr int kExcerptDepth = 16;
constexpr size_t kExcerptLength = 120;

}  // namespace

bool json_nested_within(const nlohmann::json& value, int levels) {
  if (!value.is_structured()) return true;
  if (levels <= 0) return false;
  for (const nlohmann::json& item : value) {
    if (!json_nested_within(item, levels - 1)) return false;
  }
  return true;
}

std::string json_excerpt(const nlohmann::json& value) {
  if (!json_nested_within(value, kExcerptDepth)) {
    return std::string("an ") + value.type_name() + " nested more than " +
           std::to_string(kExcerptDepth) + " levels deep";
  }
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > kExcerptLength) {
    size_t cut = kExcerptLength;
    // Not inside a UTF-8 sequence: back up over continuation bytes (10xxxxxx).
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
    text.resize(cut);
    text += "...";
  }
  return text;
}

nlohmann::json tensor_to_json(const Tensor& tensor) {
  MIXPREC_CHECK(tensor.defined(), "tensor_to_json: undefined tensor");
  const Tensor host = tensor.to(kCPU);
  return nlohmann::json{
      {"dtype", std::string(dtype_name(host.dtype()))},
      {"shape", host.shape()},
      {"data", base64_encode(static_cast<const uint8_t*>(host.data()), host.nbytes())}};
}

Tensor tensor_from_json(const nlohmann::json& value, const std::string& what) {
  MIXPREC_CHECK(value.is_object(), what, ": expected a tensor object, got ", value.type_name());
  for (const char* key : {"dtype", "shape", "data"}) {
    MIXPREC_CHECK(value.contains(key), what, ": tensor without \"", key, "\"");
  }
  MIXPREC_CHECK(value["dtype"].is_string() && value["data"].is_string() &&
                    value["shape"].is_array(),
                what, ": tensor fields have the wrong types (dtype and data are strings, shape "
                      "an array)");
  DType dtype = DType::F32;
  try {
    dtype = parse_dtype(value["dtype"].get<std::string>());
  } catch (const Error& e) {
    MIXPREC_FAIL(what, ": ", e.what());
  }
  Shape shape;
  // The byte count that the shape implies is checked against the data before anything is
  // allocated: a corrupt shape must give this error, not a huge allocation.
  uint64_t expected = dtype_size(dtype);
  bool overflow = false;
  for (const auto& extent : value["shape"]) {
    MIXPREC_CHECK(extent.is_number_integer() && extent.get<int64_t>() >= 0, what,
                  ": shape holds ", json_excerpt(extent), ", not a non-negative integer");
    shape.push_back(extent.get<int64_t>());
    overflow = overflow || __builtin_mul_overflow(expected, extent.get<uint64_t>(), &expected);
  }
  MIXPREC_CHECK(!overflow, what, ": shape ", shape_str(shape),
                " has too many bytes to count in 64 bits");
  const std::vector<uint8_t> bytes = base64_decode(value["data"].get<std::string>(), what);
  MIXPREC_CHECK(bytes.size() == expected, what, ": ", bytes.size(), " bytes of data for a ",
                dtype_name(dtype), " tensor of shape ", shape_str(shape), " (", expected,
                " expected)");
  Tensor out = Tensor::empty(shape, dtype);
  if (!bytes.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

}  // namespace mixprec
