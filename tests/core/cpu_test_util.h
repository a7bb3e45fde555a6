// Helpers shared by the tests of the CPU backend's primitives and fast paths: the backend
// itself, random inputs, and the element-by-element check against a double reference.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/generator.h"
#include "core/tensor.h"

namespace mixprec::testing {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

inline Backend& cpu_backend() { return backend_for(kCPU); }

// `n` values drawn from N(0, stddev^2) by std::mt19937(seed), stored as `dtype`.
inline Tensor normal_tensor(int64_t n, DType dtype, uint32_t seed, double stddev) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, static_cast<float>(stddev));
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return Tensor::from_vector(v, {n}, dtype);
}

// The one-element I32 tensor that tells a deferred step which entry of its rate table to take.
inline Tensor taken_tensor(int32_t j) { return Tensor::from_ints({j}, {1}); }

// Unit roundoff of a dtype's one rounding on store (none for F32: the FP32 sums' own error is
// covered by the abs-sum term of the tolerances).
inline double unit_roundoff(DType t) {
  return t == DType::F32 ? 0.0 : t == DType::F16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
}

// A tensor of `dtype` holding uniform values in [-1, 1); a reference reads its stored
// (rounded) values.
inline Tensor random_of(const Shape& shape, uint64_t seed, DType dtype) {
  Generator gen(seed);
  const Tensor values = Tensor::uniform({shape_numel(shape)}, gen, -1.f, 1.f);
  return Tensor::from_vector(values.to_float_vector(), shape, dtype);
}

// got within u * |expected| + rel_sum * abs_sum of expected, element by element.
inline void check_close(const std::vector<float>& got, const std::vector<double>& expected,
                        const std::vector<double>& abs_sum, double u, double rel_sum,
                        const std::string& what) {
  REQUIRE(got.size() == expected.size());
  int64_t bad = 0, first_bad = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double allowed = u * std::abs(expected[i]) + rel_sum * abs_sum[i] + 1e-30;
    if (!(std::abs(got[i] - expected[i]) <= allowed)) {
      if (first_bad < 0) first_bad = static_cast<int64_t>(i);
      ++bad;
    }
  }
  INFO(what << ": " << bad << " of " << got.size() << " elements off; first at " << first_bad
            << (first_bad >= 0 ? " got " + std::to_string(got[first_bad]) + " expected " +
                                     std::to_string(expected[first_bad])
                               : std::string()));
  CHECK(bad == 0);
}

}  // namespace mixprec::testing
