// The BF16 dot-product GEMM (core/cpu/bf16_dot_gemm.h): its documented summation order bit
// for bit, its error against a double reference within the bound that order gives, the
// instruction's treatment of denormal inputs, and the switch that sends BF16 products back to
// the widened path; the convolution filter gradient that runs on it (core/cpu/conv_bf16_dot.h).
// On a CPU without AVX512-BF16 the tests say so and pass.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/backend.h"
#include "core/cpu/bf16_dot_gemm.h"
#include "core/half.h"
#include "core/ops/ops.h"
#include "core/tensor.h"
#include "tests/core/packed_gemm_checks.h"
#include "core/tensor.h"

namespace {

using namespace mixprec;

using Bf16DotSwitch = testing::PathSwitch<cpu::bf16_dot_available, cpu::set_bf16_dot_allowed>;

bool dot_path_here() {
  const Bf16DotSwitch on(true);
  if (cpu::bf16_dot_available()) return true;
  WARN("skipped: this CPU has no AVX512-BF16, so BF16 products take the widened path");
  return false;
}

using testing::float_bits;
using testing::kProductShapes;
using testing::ProductShape;

using testing::op_a_at;
using testing::op_b_at;
using testing::random_operand;

}  // namespace

TEST_CASE("bf16 dot gemm sums the products in pairs, the odd one first, in FP32", "[gemm]") {
  if (!dot_path_here()) return;
  const Bf16DotSwitch on(true);
  std::mt19937 rng(11);
  for (const ProductShape& s : kProductShapes) {
    for (const bool trans_a : {false, true}) {
      for (const bool trans_b : {false, true}) {
        INFO("m " << s.m << ", n " << s.n << ", k " << s.k << ", trans_a " << trans_a
                  << ", trans_b " << trans_b);
        const std::vector<bfloat16> a = random_operand<bfloat16>(static_cast<size_t>(s.m * s.k), rng);
        const std::vector<bfloat16> b = random_operand<bfloat16>(static_cast<size_t>(s.k * s.n), rng);
        std::vector<float> c(static_cast<size_t>(s.m * s.n), NAN);
        cpu::gemm_bf16_dot(trans_a, trans_b, s.m, s.n, s.k, 1.0f, a.data(), b.data(), 0.0f,
                           c.data());
        int64_t differ = 0;
        for (int64_t i = 0; i < s.m; ++i) {
          for (int64_t j = 0; j < s.n; ++j) {
            // A BF16 product is exact in FP32, so each addition is the one rounding.
            float sum = 0.0f;
            for (int64_t p = 0; p < s.k; p += 2) {
              if (p + 1 < s.k) sum += op_a_at(a, trans_a, s, i, p + 1) * op_b_at(b, trans_b, s, p + 1, j);
              sum += op_a_at(a, trans_a, s, i, p) * op_b_at(b, trans_b, s, p, j);
            }
            differ += float_bits(sum) != float_bits(c[static_cast<size_t>(i * s.n + j)]);
          }
        }
        CHECK(differ == 0);
      }
    }
  }
}

TEST_CASE("bf16 dot gemm stays within the FP32 summation bound of a double reference",
          "[gemm]") {
  if (!dot_path_here()) return;
  const Bf16DotSwitch on(true);
  // A sum of k exact products, each addition rounded once: |computed - exact| <=
  // gamma(k - 1) * sum |a_p b_p|, gamma(n) = n u / (1 - n u), u = 2^-24; alpha adds one more
  // rounding (u |alpha sum|) and beta's fused multiply-add one more.
  constexpr double u = 0x1p-24;
  const auto gamma = [&](int64_t n) { return n * u / (1.0 - n * u); };
  std::mt19937 rng(12);
  for (const ProductShape& s : kProductShapes) {
    const float alpha = 0.75f, beta = -1.5f;
    INFO("m " << s.m << ", n " << s.n << ", k " << s.k);
    const std::vector<bfloat16> a = random_operand<bfloat16>(static_cast<size_t>(s.m * s.k), rng);
    const std::vector<bfloat16> b = random_operand<bfloat16>(static_cast<size_t>(s.k * s.n), rng);
    std::vector<float> c(static_cast<size_t>(s.m * s.n));
    for (float& v : c) v = static_cast<float>(rng() % 7) - 3.0f;
    const std::vector<float> before = c;
    cpu::gemm_bf16_dot(false, true, s.m, s.n, s.k, alpha, a.data(), b.data(), beta, c.data());
    double worst = 0.0;
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t j = 0; j < s.n; ++j) {
        double exact = 0.0, magnitude = 0.0;
        for (int64_t p = 0; p < s.k; ++p) {
          const double product = double{op_a_at(a, false, s, i, p)} * op_b_at(b, true, s, p, j);
          exact += product;
          magnitude += std::fabs(product);
        }
        const size_t at = static_cast<size_t>(i * s.n + j);
        const double expected = alpha * exact + beta * double{before[at]};
        const double bound = std::fabs(alpha) * gamma(s.k + 1) * magnitude +
                             u * std::fabs(expected) + u * std::fabs(beta * before[at]);
        const double error = std::fabs(c[at] - expected);
        worst = std::max(worst, error / bound);
        REQUIRE(error <= bound);
      }
    }
    INFO("largest error, as a share of its bound: " << worst);
    CHECK(worst <= 1.0);
  }
}

TEST_CASE("bf16 dot gemm into a BF16 C rounds the FP32 result once", "[gemm]") {
  if (!dot_path_here()) return;
  const Bf16DotSwitch on(true);
  std::mt19937 rng(14);
  CHECK(testing::rounded_store_mismatches<bfloat16>(
            [](auto... args) { cpu::gemm_bf16_dot(args...); }, rng) == 0);
}

TEST_CASE("bf16 dot gemm counts denormal BF16 inputs as zero, as the instruction does",
          "[gemm]") {
  if (!dot_path_here()) return;
  const Bf16DotSwitch on(true);
  // 2^-133 (the BF16 denormal of bits 0x0001) times 2^100 would be 2^-33, a normal FP32.
  const std::vector<bfloat16> a = {bfloat16::from_bits(0x0001), bfloat16(1.0f)};
  const std::vector<bfloat16> b = {bfloat16(0x1p100f), bfloat16(0.5f)};
  float c = NAN;
  cpu::gemm_bf16_dot(false, false, 1, 1, 2, 1.0f, a.data(), b.data(), 0.0f, &c);
  CHECK(c == 0.5f);
}

TEST_CASE("bf16 matmul takes the dot path, and the switch sends it back to the widened one",
          "[gemm]") {
  if (!dot_path_here()) return;
  // k = 300 sums enough products that the two summation orders round apart somewhere.
  const auto pattern = [](size_t count, float step) {
    std::vector<float> v(count);
    for (size_t i = 0; i < count; ++i) v[i] = std::sin(step * static_cast<float>(i));
    return v;
  };
  const Tensor a = Tensor::from_vector(pattern(40 * 300, 0.37f), {40, 300}).to(DType::BF16);
  const Tensor b = Tensor::from_vector(pattern(300 * 50, 1.3f), {300, 50}).to(DType::BF16);
  // The widened path's result: the FP32 product of the same values, rounded once.
  const std::vector<float> widened =
      ops::matmul(a.to(DType::F32), b.to(DType::F32)).to(DType::BF16).to_float_vector();
  {
    const Bf16DotSwitch off(false);
    CHECK(ops::matmul(a, b).to_float_vector() == widened);
  }
  const Bf16DotSwitch on(true);
  std::vector<float> sums(40 * 50);
  const std::vector<bfloat16> a16(static_cast<const bfloat16*>(a.data()),
                                  static_cast<const bfloat16*>(a.data()) + a.numel());
  const std::vector<bfloat16> b16(static_cast<const bfloat16*>(b.data()),
                                  static_cast<const bfloat16*>(b.data()) + b.numel());
  cpu::gemm_bf16_dot(false, false, 40, 50, 300, 1.0f, a16.data(), b16.data(), 0.0f, sums.data());
  const std::vector<float> dot = ops::matmul(a, b).to_float_vector();
  // The two orders round some sums apart, so equal results would mean the path was not taken.
  CHECK(dot != widened);
  for (size_t i = 0; i < dot.size(); ++i)
    REQUIRE(dot[i] == static_cast<float>(bfloat16(sums[i])));
}

namespace {

struct FilterGradCase {
  int64_t n, c, h, w, o, k, stride, pad;
};

// dw[o][c][p][q] = sum over n, i, j of dy[n][o][i][j] * x[n][c][i*s - pad + p][j*s - pad + q],
// and the sum of the products' magnitudes, both in double.
void reference_filter_grad(const FilterGradCase& g, const std::vector<float>& x,
                           const std::vector<float>& dy, int64_t oh, int64_t ow,
                           std::vector<double>& exact, std::vector<double>& magnitude) {
  exact.assign(static_cast<size_t>(g.o * g.c * g.k * g.k), 0.0);
  magnitude.assign(exact.size(), 0.0);
  for (int64_t o = 0; o < g.o; ++o)
    for (int64_t c = 0; c < g.c; ++c)
      for (int64_t p = 0; p < g.k; ++p)
        for (int64_t q = 0; q < g.k; ++q) {
          const size_t at = static_cast<size_t>(((o * g.c + c) * g.k + p) * g.k + q);
          for (int64_t n = 0; n < g.n; ++n)
            for (int64_t i = 0; i < oh; ++i)
              for (int64_t j = 0; j < ow; ++j) {
                const int64_t r = i * g.stride - g.pad + p, col = j * g.stride - g.pad + q;
                if (r < 0 || r >= g.h || col < 0 || col >= g.w) continue;
                const double product = double{x[((n * g.c + c) * g.h + r) * g.w + col]} *
                                       dy[((n * g.o + o) * oh + i) * ow + j];
                exact[at] += product;
                magnitude[at] += std::fabs(product);
              }
        }
}

}  // namespace

TEST_CASE("bf16 conv filter gradient on the dot path stays within its bound of a double "
          "reference", "[gemm]") {
  if (!dot_path_here()) return;
  const Bf16DotSwitch on(true);
  // Per image one FP32 sum of oh * ow exact products, then the images' sums added: every
  // element is a sum of its products with at most oh * ow + n roundings on each path through
  // it, so |sum - exact| <= gamma(oh * ow + n) * sum |products|; the one rounding to BF16 adds
  // 2^-8 of the rounded value's magnitude.
  constexpr double u = 0x1p-24, u_bf16 = 0x1p-8;
  const auto gamma = [&](int64_t n) { return n * u / (1.0 - n * u); };
  // Column-matrix rows (c * k * k) of 72 and 50: above the dot path's threshold.
  for (const FilterGradCase& g : {FilterGradCase{3, 8, 9, 11, 5, 3, 1, 1},
                                  FilterGradCase{4, 2, 13, 12, 7, 5, 2, 0}}) {
    const int64_t oh = (g.h + 2 * g.pad - g.k) / g.stride + 1;
    const int64_t ow = (g.w + 2 * g.pad - g.k) / g.stride + 1;
    INFO("x " << g.n << "x" << g.c << "x" << g.h << "x" << g.w << ", " << g.o << " filters "
              << g.k << "x" << g.k << ", stride " << g.stride << ", padding " << g.pad);
    std::mt19937 rng(static_cast<unsigned>(13 + g.k));
    const std::vector<bfloat16> x16 = random_operand<bfloat16>(static_cast<size_t>(g.n * g.c * g.h * g.w), rng);
    const std::vector<bfloat16> dy16 = random_operand<bfloat16>(static_cast<size_t>(g.n * g.o * oh * ow), rng);
    const auto widen = [](const std::vector<bfloat16>& v) {
      return std::vector<float>(v.begin(), v.end());
    };
    const Tensor x = Tensor::from_vector(widen(x16), {g.n, g.c, g.h, g.w}).to(DType::BF16);
    const Tensor dy = Tensor::from_vector(widen(dy16), {g.n, g.o, oh, ow}).to(DType::BF16);
    Conv2dDesc desc;
    desc.stride_h = desc.stride_w = g.stride;
    desc.pad_h = desc.pad_w = g.pad;
    const auto filter_grad = [&](Tensor& db) {
      Tensor dw = Tensor::empty({g.o, g.c, g.k, g.k}, DType::BF16);
      db = Tensor::empty({g.o}, DType::BF16);
      backend_for(kCPU).conv2d_backward_filter(x, dy, desc, dw, &db);
      return dw;
    };
    Tensor db;
    const std::vector<float> dw = filter_grad(db).to_float_vector();
    std::vector<double> exact, magnitude;
    reference_filter_grad(g, widen(x16), widen(dy16), oh, ow, exact, magnitude);
    for (size_t i = 0; i < exact.size(); ++i) {
      const double sum_bound = gamma(oh * ow + g.n) * magnitude[i];
      const double bound = sum_bound + u_bf16 * (std::fabs(exact[i]) + sum_bound);
      INFO("element " << i << ": " << dw[i] << " against " << exact[i]);
      REQUIRE(std::fabs(dw[i] - exact[i]) <= bound);
    }
    // The bias gradient sums dy per filter.
    const std::vector<float> dbv = db.to_float_vector();
    for (int64_t o = 0; o < g.o; ++o) {
      double sum = 0.0, size = 0.0;
      for (int64_t n = 0; n < g.n; ++n)
        for (int64_t p = 0; p < oh * ow; ++p) {
          const double v = static_cast<float>(dy16[static_cast<size_t>((n * g.o + o) * oh * ow + p)]);
          sum += v;
          size += std::fabs(v);
        }
      const double sum_bound = gamma(oh * ow + g.n) * size;
      REQUIRE(std::fabs(dbv[static_cast<size_t>(o)] - sum) <=
              sum_bound + u_bf16 * (std::fabs(sum) + sum_bound));
    }
    // The switch sends it to the widened kernel: the FP32 filter gradient of the same values,
    // rounded once.
    const Bf16DotSwitch off(false);
    const std::vector<float> widened = filter_grad(db).to_float_vector();
    Tensor dw32 = Tensor::empty({g.o, g.c, g.k, g.k});
    Tensor db32 = Tensor::empty({g.o});
    backend_for(kCPU).conv2d_backward_filter(x.to(DType::F32), dy.to(DType::F32), desc, dw32,
                                             &db32);
    CHECK(widened == dw32.to(DType::BF16).to_float_vector());
  }
}

TEST_CASE("bf16 conv filter gradient takes the dot path, which counts denormal inputs as zero",
          "[gemm]") {
  if (!dot_path_here()) return;
  // One 1x1 image of 4 channels, a 3x3 filter with padding 1 (36 column-matrix rows, above
  // the threshold): dw[0][c][1][1] = x[c] * dy. A BF16 denormal x (2^-133) times dy = 2^100
  // is 2^-33, a normal number on the widened path and 0 on the dot path.
  const Tensor x = Tensor::from_vector({0x1p-133f, 1.0f, 2.0f, -3.0f}, {1, 4, 1, 1}).to(DType::BF16);
  const Tensor dy = Tensor::from_vector({0x1p100f}, {1, 1, 1, 1}).to(DType::BF16);
  REQUIRE(static_cast<const bfloat16*>(x.data())[0].bits == 0x0001);
  Conv2dDesc desc;
  desc.pad_h = desc.pad_w = 1;
  const auto centre_taps = [&] {
    Tensor dw = Tensor::empty({1, 4, 3, 3}, DType::BF16);
    backend_for(kCPU).conv2d_backward_filter(x, dy, desc, dw, nullptr);
    const std::vector<float> v = dw.to_float_vector();
    return std::vector<float>{v[4], v[13], v[22], v[31]};
  };
  {
    const Bf16DotSwitch on(true);
    CHECK(centre_taps() == std::vector<float>{0.0f, 0x1p100f, 0x1p101f, -0x1.8p101f});
  }
  const Bf16DotSwitch off(false);
  CHECK(centre_taps() == std::vector<float>{0x1p-33f, 0x1p100f, 0x1p101f, -0x1.8p101f});
}
