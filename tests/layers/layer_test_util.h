// Helpers shared by the layers tests: seeded inputs, comparisons and gradient checks.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "layers/module.h"

namespace mixprec::layers_test {

// Values from a seeded std::mt19937 (independent of the framework's Philox generator).
inline std::vector<float> random_values(size_t n, uint32_t seed, float low = -1.f,
                                        float high = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline Tensor random_tensor(const Shape& shape, uint32_t seed, float low = -1.f, float high = 1.f,
                            DType dtype = DType::F32) {
  return Tensor::from_vector(
      random_values(static_cast<size_t>(shape_numel(shape)), seed, low, high), shape, dtype);
}

inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  const std::vector<float> x = a.to_float_vector(), y = b.to_float_vector();
  double m = 0.0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::fabs(double(x[i]) - double(y[i])));
  return m;
}

// Same dtype, same shape, same values (bit-for-bit up to float conversion).
inline bool same_values(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         a.to_float_vector() == b.to_float_vector();
}

inline double max_abs(const Tensor& t) {
  double m = 0.0;
  for (float v : t.to_float_vector()) m = std::max(m, std::fabs(static_cast<double>(v)));
  return m;
}

inline bool all_finite(const Tensor& t) {
  for (float v : t.to_float_vector())
    if (!std::isfinite(v)) return false;
  return true;
}

inline std::vector<std::string> names_of(
    const std::vector<std::pair<std::string, Tensor>>& entries) {
  std::vector<std::string> out;
  for (const auto& e : entries) out.push_back(e.first);
  return out;
}

struct MeanStd {
  double mean = 0.0, std = 0.0;
};

inline MeanStd sample_stats(const Tensor& t) {
  const std::vector<float> v = t.to_float_vector();
  double sum = 0.0, sq = 0.0;
  for (float x : v) sum += x;
  const double mean = sum / static_cast<double>(v.size());
  for (float x : v) sq += (x - mean) * (x - mean);
  return {mean, std::sqrt(sq / static_cast<double>(v.size() - 1))};
}

// After a backward: every parameter has an F32 gradient of its shape, all finite, and not
// all of them zero.
inline void check_all_grads(const Module& model) {
  for (const auto& [name, p] : model.named_parameters()) {
    CAPTURE(name);
    const Tensor g = p.grad();
    REQUIRE(g.defined());
    CHECK(g.dtype() == DType::F32);
    CHECK(g.shape() == p.shape());
    CHECK(all_finite(g));
    bool any_nonzero = false;
    for (float v : g.to_float_vector()) any_nonzero = any_nonzero || v != 0.f;
    CHECK(any_nonzero);
  }
}

// ---- double-precision references (row-major, written from the formulas) ---------------------

using Vec = std::vector<double>;

inline Vec to_double(const Tensor& t) {
  const std::vector<float> v = t.to_float_vector();
  return {v.begin(), v.end()};
}

inline double max_abs_diff(const Tensor& a, const Vec& ref) {
  const std::vector<float> x = a.to_float_vector();
  REQUIRE(x.size() == ref.size());
  double m = 0.0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::fabs(double(x[i]) - ref[i]));
  return m;
}

// x [rows, in], w [out, in], b [out] or empty -> [rows, out].
inline Vec ref_linear(const Vec& x, int64_t rows, int64_t in, const Vec& w, const Vec& b,
                      int64_t out) {
  Vec y(static_cast<size_t>(rows * out));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double acc = b.empty() ? 0.0 : b[o];
      for (int64_t i = 0; i < in; ++i) acc += x[r * in + i] * w[o * in + i];
      y[r * out + o] = acc;
    }
  return y;
}

// Over the last dim d; biased variance; w, b [d] (b may be empty).
inline Vec ref_layer_norm(const Vec& x, int64_t d, const Vec& w, const Vec& b, double eps = 1e-5) {
  Vec y(x.size());
  for (size_t r = 0; r < x.size() / d; ++r) {
    double mean = 0.0, var = 0.0;
    for (int64_t j = 0; j < d; ++j) mean += x[r * d + j];
    mean /= d;
    for (int64_t j = 0; j < d; ++j) var += (x[r * d + j] - mean) * (x[r * d + j] - mean);
    var /= d;
    for (int64_t j = 0; j < d; ++j)
      y[r * d + j] = (x[r * d + j] - mean) / std::sqrt(var + eps) * w[j] + (b.empty() ? 0.0 : b[j]);
  }
  return y;
}

// GPT-2's tanh form.
inline double ref_gelu(double x) {
  const double k = std::sqrt(2.0 / 3.14159265358979323846);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

// Multi-head causal attention on qkv [B, T, 3C] (q, k, v side by side, heads of D = C / H
// consecutive columns each) -> [B, T, C], heads side by side.
inline Vec ref_causal_attention(const Vec& qkv, int64_t batch, int64_t t_len, int64_t c,
                                int64_t heads) {
  const int64_t d = c / heads;
  Vec y(static_cast<size_t>(batch * t_len * c), 0.0);
  auto at = [&](int64_t b, int64_t t, int64_t part, int64_t h, int64_t j) {
    return qkv[(b * t_len + t) * 3 * c + part * c + h * d + j];
  };
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t t = 0; t < t_len; ++t) {
        Vec score(static_cast<size_t>(t + 1));
        double top = -1e300;
        for (int64_t s = 0; s <= t; ++s) {
          double dot = 0.0;
          for (int64_t j = 0; j < d; ++j) dot += at(b, t, 0, h, j) * at(b, s, 1, h, j);
          score[s] = dot / std::sqrt(static_cast<double>(d));
          top = std::max(top, score[s]);
        }
        double total = 0.0;
        for (double& v : score) total += (v = std::exp(v - top));
        for (int64_t j = 0; j < d; ++j) {
          double acc = 0.0;
          for (int64_t s = 0; s <= t; ++s) acc += score[s] / total * at(b, s, 2, h, j);
          y[(b * t_len + t) * c + h * d + j] = acc;
        }
      }
  return y;
}

}  // namespace mixprec::layers_test
