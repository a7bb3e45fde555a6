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

}  // namespace mixprec_test
