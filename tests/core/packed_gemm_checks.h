// Helpers of the tests of the CPU's packed 16-bit GEMMs (core/cpu/bf16_dot_gemm.h,
// core/cpu/f16_gemm.h): a guard for a path's on/off switch, random operands, the shapes around
// the kernels' tiles, and the elements of op(a) and op(b) as the products read them.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace mixprec::testing {

// Sets a path's switch for a scope and leaves it as it found it: `is_on` reads it, `set` sets
// it.
template <bool (*is_on)(), void (*set)(bool)>
class PathSwitch {
 public:
  explicit PathSwitch(bool on) : before_(is_on()) { set(on); }
  ~PathSwitch() { set(before_); }
  PathSwitch(const PathSwitch&) = delete;
  PathSwitch& operator=(const PathSwitch&) = delete;

 private:
  bool before_;
};

// Values of magnitude in [2^-4, 4), either sign: products and partial sums stay far from
// FP32's denormals.
template <class T>
std::vector<T> random_operand(size_t count, std::mt19937& rng) {
  std::uniform_real_distribution<float> magnitude(0.0625f, 4.0f);
  std::vector<T> out(count);
  for (T& v : out) v = T(rng() % 2 ? magnitude(rng) : -magnitude(rng));
  return out;
}

struct ProductShape {
  int64_t m, n, k;
};

// m, n and k around the kernels' tile (6 rows, 64 columns, pairs of k) and packing tasks,
// odd and even; the last two have more than 2^20 multiply-adds, so they run on the OpenMP
// threads (packing tasks, then tiles) where the others stay on the calling thread.
inline const std::vector<ProductShape> kProductShapes = {
    {1, 1, 1},     {7, 65, 3},     {13, 130, 64}, {6, 64, 255},
    {5, 17, 1000}, {70, 200, 33}, {130, 150, 71}, {64, 300, 64}};

// Element (i, p) of op(a) and (p, j) of op(b), as the GEMMs read them.
template <class T>
float op_a_at(const std::vector<T>& a, bool trans, const ProductShape& s, int64_t i, int64_t p) {
  return static_cast<float>(trans ? a[p * s.m + i] : a[i * s.k + p]);
}
template <class T>
float op_b_at(const std::vector<T>& b, bool trans, const ProductShape& s, int64_t p, int64_t j) {
  return static_cast<float>(trans ? b[j * s.k + p] : b[p * s.n + j]);
}

// `gemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c)` into a 16-bit C (T) must store
// what it gives into an FP32 C holding the same old values, rounded once: for beta 0 and for
// beta != 0, where the old 16-bit values are widened. Returns the number of elements that
// differ in their bits.
template <class T, class Gemm>
int64_t rounded_store_mismatches(const Gemm& gemm, std::mt19937& rng) {
  int64_t differ = 0;
  for (const ProductShape& s : kProductShapes) {
    for (const float beta : {0.0f, -1.5f}) {
      const std::vector<T> a = random_operand<T>(static_cast<size_t>(s.m * s.k), rng);
      const std::vector<T> b = random_operand<T>(static_cast<size_t>(s.k * s.n), rng);
      std::vector<T> c = random_operand<T>(static_cast<size_t>(s.m * s.n), rng);
      std::vector<float> sums(c.begin(), c.end());
      gemm(false, true, s.m, s.n, s.k, 0.75f, a.data(), b.data(), beta, sums.data());
      gemm(false, true, s.m, s.n, s.k, 0.75f, a.data(), b.data(), beta, c.data());
      for (size_t i = 0; i < c.size(); ++i) differ += c[i].bits != T(sums[i]).bits;
    }
  }
  // Results at the edges of the 16-bit formats: C = [[2^-10, 0], [2^10, 0]] @ op(b) scales
  // each b value by 2^-10 (into FP16's and BF16's subnormals, where the store must round off
  // bits) and by 2^10 (past their largest values, where it must give infinity), beside zeros,
  // infinities and a NaN. b's values are T's own, so the FP32 sums are exact.
  const std::vector<float> edges = {0x1.8p-5f,   0x1.4p-13f,  0x1.ffcp-14f, 0x1p-14f,
                                    0x1.8p-120f, 0x1.4p-126f, 0x1.ecp-117f, 64.0f,
                                    63.97f,      0x1.fep127f, -0x1.8p-5f,   NAN,
                                    INFINITY,    0.0f,        3.0f,         -0x1.7p-118f};
  const int64_t n = static_cast<int64_t>(edges.size());
  const std::vector<T> a = {T(0x1p-10f), T(0.0f), T(0x1p10f), T(0.0f)};
  std::vector<T> b;
  for (const float e : edges) b.insert(b.end(), {T(e), T(0.0f)});
  std::vector<float> sums(static_cast<size_t>(2 * n), 0.0f);
  std::vector<T> c(static_cast<size_t>(2 * n), T(0.0f));
  gemm(false, true, 2, n, 2, 1.0f, a.data(), b.data(), 0.0f, sums.data());
  gemm(false, true, 2, n, 2, 1.0f, a.data(), b.data(), 0.0f, c.data());
  for (size_t i = 0; i < c.size(); ++i) differ += c[i].bits != T(sums[i]).bits;
  return differ;
}

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

}  // namespace mixprec::testing
