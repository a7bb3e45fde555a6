// The FP16 packed GEMM (core/cpu/f16_gemm.h): its documented summation order bit for bit,
// its error against a double reference within the bound that order gives, and the switch
// that sends FP16 products back to the widened Eigen path. On a CPU without AVX-512 and F16C
// the tests say so and pass.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/cpu/f16_gemm.h"
#include "core/cpu/tile_gemm.h"
#include "core/half.h"
#include "core/ops/ops.h"
#include "core/tensor.h"
#include "tests/core/packed_gemm_checks.h"

namespace {

using namespace mixprec;

// The AVX-512 kernels' switch, which the packed FP16 path follows.
using VectorKernels = testing::PathSwitch<cpu::tile_gemm_vectorised, cpu::set_tile_gemm_vectorised>;

bool packed_path_here() {
  const VectorKernels on(true);
  if (cpu::f16_packed_available()) return true;
  WARN("skipped: this CPU lacks AVX-512 or F16C, so FP16 products take the widened path");
  return false;
}

using testing::float_bits;
using testing::kProductShapes;
using testing::op_a_at;
using testing::op_b_at;
using testing::ProductShape;

}  // namespace

TEST_CASE("f16 packed gemm is one fused multiply-add per product, in k order", "[gemm]") {
  if (!packed_path_here()) return;
  const VectorKernels on(true);
  std::mt19937 rng(21);
  for (const ProductShape& s : kProductShapes) {
    for (const bool trans_a : {false, true}) {
      for (const bool trans_b : {false, true}) {
        INFO("m " << s.m << ", n " << s.n << ", k " << s.k << ", trans_a " << trans_a
                  << ", trans_b " << trans_b);
        const std::vector<half> a = testing::random_operand<half>(static_cast<size_t>(s.m * s.k), rng);
        const std::vector<half> b = testing::random_operand<half>(static_cast<size_t>(s.k * s.n), rng);
        std::vector<float> c(static_cast<size_t>(s.m * s.n), NAN);
        cpu::gemm_f16_packed(trans_a, trans_b, s.m, s.n, s.k, 1.0f, a.data(), b.data(), 0.0f,
                             c.data());
        int64_t differ = 0;
        for (int64_t i = 0; i < s.m; ++i) {
          for (int64_t j = 0; j < s.n; ++j) {
            float sum = 0.0f;
            for (int64_t p = 0; p < s.k; ++p)
              sum = std::fma(op_a_at(a, trans_a, s, i, p), op_b_at(b, trans_b, s, p, j), sum);
            differ += float_bits(sum) != float_bits(c[static_cast<size_t>(i * s.n + j)]);
          }
        }
        CHECK(differ == 0);
      }
    }
  }
}

TEST_CASE("f16 packed gemm stays within the FP32 summation bound of a double reference",
          "[gemm]") {
  if (!packed_path_here()) return;
  const VectorKernels on(true);
  // k fused multiply-adds, each rounding once: |computed - exact| <= gamma(k) * sum |a_p b_p|,
  // gamma(n) = n u / (1 - n u), u = 2^-24; alpha adds one more rounding (u |alpha sum|) and
  // beta's fused multiply-add one more.
  constexpr double u = 0x1p-24;
  const auto gamma = [&](int64_t n) { return n * u / (1.0 - n * u); };
  std::mt19937 rng(22);
  for (const ProductShape& s : kProductShapes) {
    const float alpha = 0.75f, beta = -1.5f;
    INFO("m " << s.m << ", n " << s.n << ", k " << s.k);
    const std::vector<half> a = testing::random_operand<half>(static_cast<size_t>(s.m * s.k), rng);
    const std::vector<half> b = testing::random_operand<half>(static_cast<size_t>(s.k * s.n), rng);
    std::vector<float> c(static_cast<size_t>(s.m * s.n));
    for (float& v : c) v = static_cast<float>(rng() % 7) - 3.0f;
    const std::vector<float> before = c;
    cpu::gemm_f16_packed(true, false, s.m, s.n, s.k, alpha, a.data(), b.data(), beta, c.data());
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t j = 0; j < s.n; ++j) {
        double exact = 0.0, magnitude = 0.0;
        for (int64_t p = 0; p < s.k; ++p) {
          const double product = double{op_a_at(a, true, s, i, p)} * op_b_at(b, false, s, p, j);
          exact += product;
          magnitude += std::fabs(product);
        }
        const size_t at = static_cast<size_t>(i * s.n + j);
        const double expected = alpha * exact + beta * double{before[at]};
        const double bound = std::fabs(alpha) * gamma(s.k + 1) * magnitude +
                             u * std::fabs(expected) + u * std::fabs(beta * before[at]);
        REQUIRE(std::fabs(c[at] - expected) <= bound);
      }
    }
  }
}

TEST_CASE("f16 matmul takes the packed path, and the switch sends it back to the widened one",
          "[gemm]") {
  if (!packed_path_here()) return;
  // k = 300 sums enough products that the two summation orders round apart somewhere, and an
  // F32 C keeps the sums unrounded.
  const auto pattern = [](size_t count, float step) {
    std::vector<float> v(count);
    for (size_t i = 0; i < count; ++i) v[i] = std::sin(step * static_cast<float>(i));
    return v;
  };
  const Tensor a = Tensor::from_vector(pattern(40 * 300, 0.37f), {40, 300}).to(DType::F16);
  const Tensor b = Tensor::from_vector(pattern(300 * 50, 1.3f), {300, 50}).to(DType::F16);
  // The widened path: Eigen's FP32 product of the same values (the AVX-512 tile kernel, which
  // sums in the packed path's order, is off with it), rounded once.
  std::vector<float> widened_sums, widened;
  {
    const VectorKernels off(false);
    widened_sums = ops::matmul(a.to(DType::F32), b.to(DType::F32)).to_float_vector();
    widened = ops::matmul(a.to(DType::F32), b.to(DType::F32)).to(DType::F16).to_float_vector();
    CHECK(ops::matmul(a, b).to_float_vector() == widened);
  }
  const VectorKernels on(true);
  std::vector<float> sums(40 * 50);
  const std::vector<half> a16(static_cast<const half*>(a.data()),
                              static_cast<const half*>(a.data()) + a.numel());
  const std::vector<half> b16(static_cast<const half*>(b.data()),
                              static_cast<const half*>(b.data()) + b.numel());
  cpu::gemm_f16_packed(false, false, 40, 50, 300, 1.0f, a16.data(), b16.data(), 0.0f,
                       sums.data());
  // Eigen's blocked order rounds some sums apart, so equal sums would mean no packed product.
  CHECK(sums != widened_sums);
  const std::vector<float> packed = ops::matmul(a, b).to_float_vector();
  for (size_t i = 0; i < packed.size(); ++i)
    REQUIRE(packed[i] == static_cast<float>(half(sums[i])));
}

TEST_CASE("f16 packed gemm into an FP16 C rounds the FP32 result once", "[gemm]") {
  if (!packed_path_here()) return;
  const VectorKernels on(true);
  std::mt19937 rng(23);
  CHECK(testing::rounded_store_mismatches<half>(
            [](auto... args) { cpu::gemm_f16_packed(args...); }, rng) == 0);
}
