// Helpers shared by the optimizer tests.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/half.h"
#include "layers/parameter.h"
#include "tests/tensor_bytes.h"

namespace mixprec_test {

// n values drawn from N(0, stddev^2) with a seeded generator.
inline std::vector<float> random_values(size_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// The working copy holds exactly the rounding of the master.
inline bool working_matches_master(const mixprec::Parameter& p) {
  const mixprec::Tensor w = p.working();
  const std::vector<float> m = p.master().to_float_vector();
  for (size_t i = 0; i < m.size(); ++i) {
    uint16_t bits;
    std::memcpy(&bits, static_cast<const uint8_t*>(w.data()) + 2 * i, sizeof bits);
    const uint16_t expected = w.dtype() == mixprec::DType::F16 ? mixprec::float_to_half_bits(m[i])
                                                               : mixprec::float_to_bf16_bits(m[i]);
    if (bits != expected) return false;
  }
  return true;
}

}  // namespace mixprec_test
