// A tensor's bytes, for tests that compare results bit for bit or build tensors from exact
// bit patterns. CPU tensors only.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include <catch2/catch.hpp>

#include "core/tensor.h"

namespace mixprec_test {

inline std::vector<uint8_t> raw_bytes(const mixprec::Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.data());
  return std::vector<uint8_t>(p, p + t.nbytes());
}

// A tensor whose bytes are exactly `bytes`.
inline mixprec::Tensor tensor_from_bytes(const std::vector<uint8_t>& bytes,
                                         const mixprec::Shape& shape, mixprec::DType dtype) {
  mixprec::Tensor out = mixprec::Tensor::empty(shape, dtype);
  REQUIRE(out.nbytes() == bytes.size());
  if (!bytes.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

// The bit patterns of t's values as floats (F16 and BF16 widen exactly), so that NaNs and the
// sign of zero compare too.
inline std::vector<uint32_t> float_bits(const mixprec::Tensor& t) {
  const std::vector<float> values = t.to_float_vector();
  std::vector<uint32_t> bits(values.size());
  std::memcpy(bits.data(), values.data(), values.size() * sizeof(float));
  return bits;
}

}  // namespace mixprec_test
