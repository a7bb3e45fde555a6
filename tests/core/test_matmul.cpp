// GEMM (the backend primitive), matmul and linear: forwards against double-loop references,
// gradients against finite differences, FP16/BF16 against FP32, the one-rounding rule of
// FP16/BF16 GEMM, its unrounded F32-output form, and input validation.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "core/autograd/grad_mode.h"
#include "core/backend.h"
#include "core/half.h"
#include "core/ops/gemm_desc.h"
#include "gradcheck.h"

namespace {

using namespace mixprec;
using namespace mixprec::testing;

// Element (r, c) of op(X) for a row-major rows x cols matrix X stored at `x`.
double op_at(const std::vector<float>& x, int64_t offset, bool trans, int64_t rows_op,
             int64_t cols_op, int64_t r, int64_t c) {
  return trans ? x[offset + c * rows_op + r] : x[offset + r * cols_op + c];
}

// Reference batched product in double: a holds `batch` (or 1 when a_shared) matrices, same
// for b.
std::vector<double> reference_matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
                                     int64_t batch, int64_t m, int64_t n, int64_t k,
                                     bool b_shared) {
  const std::vector<float> va = a.to_float_vector(), vb = b.to_float_vector();
  std::vector<double> out(static_cast<size_t>(batch * m * n), 0.0);
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t oa = i * m * k, ob = b_shared ? 0 : i * k * n;
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p)
          s += op_at(va, oa, trans_a, m, k, r, p) * op_at(vb, ob, trans_b, k, n, p, c);
        out[(i * m + r) * n + c] = s;
      }
  }
  return out;
}

Shape stored(int64_t rows, int64_t cols, bool trans) {
  return trans ? Shape{cols, rows} : Shape{rows, cols};
}

Shape with_batch(Shape batch, const Shape& matrix) {
  batch.insert(batch.end(), matrix.begin(), matrix.end());
  return batch;
}

}  // namespace

TEST_CASE("gemm: contract of the backend primitive", "[gemm]") {
  Backend& cpu = backend_for(kCPU);
  const int64_t m = 3, n = 4, k = 5;

  SECTION("beta == 0 never reads C, alpha scales the product") {
    for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
      const Tensor a = random_tensor({m, k}, 1, -1, 1, dtype);
      const Tensor b = random_tensor({k, n}, 2, -1, 1, dtype);
      Tensor c = Tensor::full({m, n}, std::numeric_limits<double>::quiet_NaN(), dtype);
      cpu.gemm(ops::gemm_desc(false, false, m, n, k, 0.5f), a, b, c);
      std::vector<double> expected = reference_matmul(a, b, false, false, 1, m, n, k, false);
      for (double& e : expected) e *= 0.5;
      require_matches(c, expected, dtype == DType::F32 ? 1e-6 : 1e-2);
    }
  }

  SECTION("beta accumulates into C in FP32 before the one rounding") {
    const Tensor a = random_tensor({m, k}, 3, -1, 1);
    const Tensor b = random_tensor({k, n}, 4, -1, 1);
    const Tensor c0 = random_tensor({m, n}, 5, -1, 1);
    for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
      const Tensor al = a.to(dtype), bl = b.to(dtype);
      Tensor c = c0.to(dtype).clone();
      cpu.gemm(ops::gemm_desc(false, false, m, n, k, 2.0f, -1.5f), al, bl, c);
      const std::vector<double> ab = reference_matmul(al, bl, false, false, 1, m, n, k, false);
      const std::vector<float> cv = c0.to(dtype).to_float_vector();
      const std::vector<float> got = c.to_float_vector();
      for (size_t i = 0; i < got.size(); ++i) {
        const float exact = static_cast<float>(2.0 * ab[i] - 1.5 * cv[i]);
        const float rounded = dtype == DType::F16    ? static_cast<float>(half(exact))
                              : dtype == DType::BF16 ? static_cast<float>(bfloat16(exact))
                                                     : exact;
        INFO(dtype_name(dtype) << " element " << i);
        CHECK(got[i] == Approx(rounded).epsilon(1e-5).margin(1e-6));
      }
    }
  }

  SECTION("batch strides, stride 0 broadcasts, transposes") {
    const int64_t batch = 3;
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const Tensor a = random_tensor({batch, m * k}, 6, -1, 1);
        const Tensor b = random_tensor({k * n}, 7, -1, 1);
        Tensor c = Tensor::empty({batch, m, n});
        cpu.gemm(ops::batched_gemm_desc(ta, tb, m, n, k, batch, m * k, 0), a, b, c);
        require_matches(c, reference_matmul(a, b, ta, tb, batch, m, n, k, true), 1e-6);
      }
  }

  SECTION("k == 0 gives zeros (beta == 0) or beta * C") {
    const Tensor a = Tensor::empty({0});
    Tensor c = Tensor::full({2, 2}, 3.0);
    GemmDesc d = ops::gemm_desc(false, false, 2, 2, 0, 1.0f, 2.0f);
    cpu.gemm(d, a, a, c);
    CHECK(c.get(3) == 6.0);
    d.beta = 0.0f;
    cpu.gemm(d, a, a, c);
    CHECK(c.get(0) == 0.0);
  }

  SECTION("bad descriptors throw") {
    const Tensor a = Tensor::zeros({m, k}), b = Tensor::zeros({k, n});
    Tensor c = Tensor::zeros({m, n});
    GemmDesc d = ops::gemm_desc(false, false, m, n, k + 1);
    REQUIRE_THROWS_WITH(cpu.gemm(d, a, b, c),
                        Catch::Contains("gemm") && Catch::Contains("too small"));
    d.k = k;
    Tensor c16 = Tensor::zeros({m, n}, DType::F16);
    REQUIRE_THROWS_WITH(cpu.gemm(d, a, b, c16),
                        Catch::Contains("gemm") && Catch::Contains("F16[3, 4]"));
    Tensor ci = Tensor::zeros({m, n}, DType::I32);
    const Tensor ai = Tensor::zeros({m, k}, DType::I32), bi = Tensor::zeros({k, n}, DType::I32);
    REQUIRE_THROWS_WITH(cpu.gemm(d, ai, bi, ci), Catch::Contains("gemm") && Catch::Contains("I32"));
  }
}

TEST_CASE("gemm: F16/BF16 operands into an F32 C are not rounded", "[gemm]") {
  Backend& cpu = backend_for(kCPU);

  SECTION("a K = 3 dot product keeps its exact FP32 value") {
    // big + 0.5 + 0.25 (+ beta * 0.125) is exact in FP32 but falls between two neighbours of
    // the 16-bit format (F16 spacing 2 at 2048, BF16 spacing 2 at 256).
    struct Case {
      DType dtype;
      float big;
    };
    for (const Case& c : {Case{DType::F16, 2048.f}, Case{DType::BF16, 256.f}}) {
      INFO(dtype_name(c.dtype));
      const Tensor a = Tensor::ones({1, 3}, c.dtype);
      const Tensor b = Tensor::from_vector({c.big, 0.5f, 0.25f}, {3, 1}, c.dtype);
      const float exact = c.big + 0.75f;
      REQUIRE((c.dtype == DType::F16 ? static_cast<float>(half(exact))
                                     : static_cast<float>(bfloat16(exact))) != exact);
      Tensor y = Tensor::full({1, 1}, std::numeric_limits<double>::quiet_NaN());
      cpu.gemm(ops::gemm_desc(false, false, 1, 1, 3), a, b, y);
      CHECK(y.get(0) == exact);
      // alpha and beta are applied in FP32 and the sum is not rounded either.
      y.set(0, 0.125);
      cpu.gemm(ops::gemm_desc(false, false, 1, 1, 3, 2.0f, 1.0f), a, b, y);
      CHECK(y.get(0) == 2.0 * exact + 0.125);
      // The same through the transposed path.
      cpu.gemm(ops::gemm_desc(true, true, 1, 1, 3), b, a, y);
      CHECK(y.get(0) == exact);
    }
  }

  SECTION("a product beyond the F16 range stays finite") {
    // 300 * 300 * 2 = 180000 > 65504, the largest finite F16.
    const Tensor a = Tensor::full({2, 2}, 300.0, DType::F16);
    Tensor y = Tensor::empty({2, 2});
    cpu.gemm(ops::gemm_desc(false, true, 2, 2, 2), a, a, y);
    for (int64_t i = 0; i < 4; ++i) CHECK(y.get(i) == 180000.0);
  }

  SECTION("batched and transposed products match a double reference") {
    const int64_t batch = 3, m = 5, n = 7, k = 13;
    for (DType dtype : {DType::F16, DType::BF16})
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          INFO(dtype_name(dtype) << " trans_a " << ta << " trans_b " << tb);
          const Tensor a = random_tensor({batch, m * k}, 81, -4, 4, dtype);
          const Tensor b = random_tensor({k * n}, 82, -4, 4, dtype);
          const Tensor c0 = random_tensor({batch, m, n}, 83, -4, 4);
          Tensor c = c0.clone();
          cpu.gemm(ops::batched_gemm_desc(ta, tb, m, n, k, batch, m * k, 0, 0.5f, -2.0f), a, b,
                   c);
          std::vector<double> expected = reference_matmul(a, b, ta, tb, batch, m, n, k, true);
          const std::vector<float> cv = c0.to_float_vector();
          for (size_t i = 0; i < expected.size(); ++i)
            expected[i] = 0.5 * expected[i] - 2.0 * cv[i];
          // FP32 accumulation of exactly widened inputs: FP32 accuracy, far below one 16-bit
          // ulp (which would be ~1e-3 relative for F16 and ~1e-2 for BF16).
          require_matches(c, expected, 1e-5);
        }
  }

  SECTION("other dtype combinations throw naming the dtypes") {
    const GemmDesc d = ops::gemm_desc(false, false, 3, 4, 5);
    const Tensor a32 = Tensor::zeros({3, 5}), b32 = Tensor::zeros({5, 4});
    const Tensor a16 = Tensor::zeros({3, 5}, DType::F16), b16 = Tensor::zeros({5, 4}, DType::F16);
    const Tensor bb16 = Tensor::zeros({5, 4}, DType::BF16);
    Tensor c32 = Tensor::zeros({3, 4});
    Tensor c16 = Tensor::zeros({3, 4}, DType::F16), cb16 = Tensor::zeros({3, 4}, DType::BF16);
    // F32 operands never round into a 16-bit C.
    REQUIRE_THROWS_WITH(cpu.gemm(d, a32, b32, c16), Catch::Contains("gemm") &&
                                                        Catch::Contains("F32[3, 5]") &&
                                                        Catch::Contains("F16[3, 4]"));
    REQUIRE_THROWS_WITH(cpu.gemm(d, a32, b32, cb16),
                        Catch::Contains("gemm") && Catch::Contains("BF16[3, 4]"));
    // A and B must share their dtype, whatever C is.
    REQUIRE_THROWS_WITH(cpu.gemm(d, a16, bb16, c32), Catch::Contains("gemm") &&
                                                         Catch::Contains("F16[3, 5]") &&
                                                         Catch::Contains("BF16[5, 4]"));
    REQUIRE_THROWS_WITH(cpu.gemm(d, a16, bb16, c16),
                        Catch::Contains("gemm") && Catch::Contains("BF16[5, 4]"));
    // A 16-bit C of the other 16-bit format.
    REQUIRE_THROWS_WITH(cpu.gemm(d, a16, b16, cb16), Catch::Contains("gemm") &&
                                                         Catch::Contains("F16[3, 5]") &&
                                                         Catch::Contains("BF16[3, 4]"));
    // F16 operands into an I32 C.
    Tensor ci = Tensor::zeros({3, 4}, DType::I32);
    REQUIRE_THROWS_WITH(cpu.gemm(d, a16, b16, ci),
                        Catch::Contains("gemm") && Catch::Contains("I32[3, 4]"));
  }
}

TEST_CASE("gemm: FP16/BF16 accumulate in FP32 and round once", "[gemm]") {
  // sum_i a_i b_i with a_i = 1, b_0 = big and every other b_i = 1: an accumulator in the
  // 16-bit format gets stuck at `big` (adding 1 rounds back to it), FP32 is exact.
  const int64_t k = 4096;
  struct Case {
    DType dtype;
    float big;
    float expected;  // (big + k - 1) rounded once to the format
  };
  // F16: 2048 + 4095 = 6143 -> 6144 (spacing 4). BF16: 256 + 4095 = 4351 -> 4352 (spacing 32).
  for (const Case& c : {Case{DType::F16, 2048.f, 6144.f}, Case{DType::BF16, 256.f, 4352.f}}) {
    std::vector<float> bv(k, 1.0f);
    bv[0] = c.big;
    const Tensor a = Tensor::ones({1, k}, c.dtype);
    const Tensor b = Tensor::from_vector(bv, {k, 1}, c.dtype);

    float naive = 0.0f;  // what per-step rounding to the 16-bit format would give
    for (float v : bv) {
      naive = c.dtype == DType::F16 ? static_cast<float>(half(naive + v))
                                    : static_cast<float>(bfloat16(naive + v));
    }
    REQUIRE(naive == c.big);
    const float fp32_sum = c.big + static_cast<float>(k - 1);
    REQUIRE((c.dtype == DType::F16 ? static_cast<float>(half(fp32_sum))
                                   : static_cast<float>(bfloat16(fp32_sum))) == c.expected);

    INFO(dtype_name(c.dtype));
    const Tensor y = ops::matmul(a, b);
    CHECK(y.dtype() == c.dtype);
    CHECK(y.get(0) == c.expected);
    // Same through the transposed path and a batch of two.
    const Tensor yt = ops::matmul(b, a, true, true);
    CHECK(yt.get(0) == c.expected);
    const Tensor a2 = Tensor::ones({2, 1, k}, c.dtype);
    const Tensor y2 = ops::matmul(a2, b);
    CHECK(y2.get(0) == c.expected);
    CHECK(y2.get(1) == c.expected);
  }
}

TEST_CASE("matmul: forward matches a double-loop reference", "[gemm]") {
  const int64_t m = 7, n = 3, k = 13;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      INFO("trans_a " << ta << " trans_b " << tb);
      // 2-D
      const Tensor a = random_tensor(stored(m, k, ta), 11);
      const Tensor b = random_tensor(stored(k, n, tb), 12);
      const Tensor y = ops::matmul(a, b, ta, tb);
      REQUIRE(y.shape() == Shape{m, n});
      require_matches(y, reference_matmul(a, b, ta, tb, 1, m, n, k, false), 1e-5);
      // batched over [2, 3]
      const Tensor ab = random_tensor(with_batch({2, 3}, stored(m, k, ta)), 13);
      const Tensor bb = random_tensor(with_batch({2, 3}, stored(k, n, tb)), 14);
      const Tensor yb = ops::matmul(ab, bb, ta, tb);
      REQUIRE(yb.shape() == Shape{2, 3, m, n});
      require_matches(yb, reference_matmul(ab, bb, ta, tb, 6, m, n, k, false), 1e-5);
      // 2-D b shared by the batch
      const Tensor ys = ops::matmul(ab, b, ta, tb);
      REQUIRE(ys.shape() == Shape{2, 3, m, n});
      require_matches(ys, reference_matmul(ab, b, ta, tb, 6, m, n, k, true), 1e-5);
    }
}

TEST_CASE("matmul: a large product matches the reference (Eigen's blocked path)", "[gemm]") {
  const int64_t m = 129, n = 67, k = 300;
  const Tensor a = random_tensor({k, m}, 21);
  const Tensor b = random_tensor({n, k}, 22);
  const Tensor y = ops::matmul(a, b, true, true);
  require_matches(y, reference_matmul(a, b, true, true, 1, m, n, k, false), 1e-4);
}

TEST_CASE("matmul: a batch large enough to run in parallel over its items", "[gemm]") {
  // 8 x 32^3 multiply-adds: the GEMM spreads the batch over the threads.
  const Tensor a = random_tensor({8, 32, 32}, 23);
  const Tensor b = random_tensor({8, 32, 32}, 24);
  const Tensor y = ops::matmul(a, b, false, true);
  require_matches(y, reference_matmul(a, b, false, true, 8, 32, 32, 32, false), 1e-5);
  for (DType dtype : {DType::F16, DType::BF16}) {
    // The 16-bit GEMM is the FP32 GEMM of the widened inputs, rounded once: bit for bit.
    const Tensor al = a.to(dtype), bl = b.to(dtype);
    const Tensor y32 = ops::matmul(al.to(DType::F32), bl.to(DType::F32), false, true);
    const Tensor yl = ops::matmul(al, bl, false, true);
    CHECK(yl.to_float_vector() == y32.to(dtype).to_float_vector());
  }
}

TEST_CASE("matmul: FP16/BF16 forward and backward", "[gemm]") {
  const Tensor a = random_tensor({2, 5, 33}, 41);
  const Tensor b = random_tensor({33, 6}, 42);
  const auto f = [](const std::vector<Tensor>& in) { return ops::matmul(in[0], in[1]); };
  for (DType dtype : {DType::F16, DType::BF16}) {
    check_low_precision("matmul", f, {a, b}, dtype, 4.0);

    const double rtol = low_precision_rtol(dtype);
    check_low_precision_grads("matmul", f, {a, b}, random_tensor({2, 5, 6}, 43), dtype, rtol,
                              {4 * rtol, 10 * rtol});
  }
}

TEST_CASE("matmul: bad inputs name the op, shapes and dtypes", "[gemm]") {
  const Tensor a = Tensor::zeros({2, 3});
  const Tensor b = Tensor::zeros({4, 5});
  REQUIRE_THROWS_WITH(ops::matmul(a, b), Catch::Contains("matmul") &&
                                             Catch::Contains("F32[2, 3]") &&
                                             Catch::Contains("F32[4, 5]"));
  REQUIRE_THROWS_WITH(ops::matmul(Tensor(), b),
                      Catch::Contains("matmul") && Catch::Contains("undefined"));
  REQUIRE_THROWS_WITH(ops::matmul(Tensor::zeros({0, 3}), Tensor::zeros({3, 2})),
                      Catch::Contains("matmul") && Catch::Contains("empty"));
  REQUIRE_THROWS_WITH(ops::matmul(Tensor::zeros({3}), Tensor::zeros({3, 2})),
                      Catch::Contains("matmul") && Catch::Contains("F32[3]"));
  REQUIRE_THROWS_WITH(
      ops::matmul(a, Tensor::zeros({3, 2}, DType::F16)),
      Catch::Contains("matmul") && Catch::Contains("F16[3, 2]") && Catch::Contains("dtype"));
  REQUIRE_THROWS_WITH(
      ops::matmul(Tensor::zeros({2, 3}, DType::I32), Tensor::zeros({3, 2}, DType::I32)),
      Catch::Contains("matmul") && Catch::Contains("I32[2, 3]"));
  REQUIRE_THROWS_WITH(
      ops::matmul(Tensor::zeros({2, 2, 3}), Tensor::zeros({3, 3, 4})),
      Catch::Contains("matmul") && Catch::Contains("batch") && Catch::Contains("F32[3, 3, 4]"));
  REQUIRE_THROWS_WITH(ops::matmul(a, Tensor::zeros({2, 3, 4})),
                      Catch::Contains("matmul") && Catch::Contains("batch"));
  // With trans_b the contraction is over b's last dim.
  REQUIRE_THROWS_WITH(ops::matmul(a, Tensor::zeros({3, 4}), false, true),
                      Catch::Contains("matmul") && Catch::Contains("trans_b=true"));
}

TEST_CASE("linear: forward matches a double-loop reference", "[gemm]") {
  const int64_t in = 13, out = 7;
  const Tensor x = random_tensor({2, 3, in}, 51);
  const Tensor w = random_tensor({out, in}, 52);
  const Tensor bias = random_tensor({out}, 53);
  const std::vector<float> vx = x.to_float_vector(), vw = w.to_float_vector(),
                           vb = bias.to_float_vector();
  std::vector<double> expected(6 * out), expected_nobias(6 * out);
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (int64_t i = 0; i < in; ++i) s += static_cast<double>(vx[r * in + i]) * vw[o * in + i];
      expected_nobias[r * out + o] = s;
      expected[r * out + o] = s + vb[o];
    }
  const Tensor y = ops::linear(x, w, bias);
  REQUIRE(y.shape() == Shape{2, 3, out});
  require_matches(y, expected, 1e-5);
  require_matches(ops::linear(x, w), expected_nobias, 1e-5);
  // A 1-D input is one row.
  const Tensor x1 = Tensor::from_vector(std::vector<float>(vx.begin(), vx.begin() + in), {in});
  const Tensor y1 = ops::linear(x1, w, bias);
  REQUIRE(y1.shape() == Shape{out});
  require_matches(y1, std::vector<double>(expected.begin(), expected.begin() + out), 1e-5);
}

TEST_CASE("linear: bias is folded into the GEMM's single rounding", "[gemm]") {
  // x w^T = 2049 exactly in FP32; + bias 1 = 2050, representable in FP16. Rounding the product
  // first would give 2048 (tie to even), and 2048 + 1 rounds back to 2048.
  const Tensor x = Tensor::from_vector({2048.f, 1.f}, {1, 2}, DType::F16);
  const Tensor w = Tensor::ones({1, 2}, DType::F16);
  const Tensor bias = Tensor::ones({1}, DType::F16);
  CHECK(ops::linear(x, w, bias).get(0) == 2050.0);
}

// A 1-D x, which the op table does not draw.
TEST_CASE("linear: gradients of a 1-D x match finite differences", "[gemm]") {
  const auto f = [](const std::vector<Tensor>& in) { return ops::linear(in[0], in[1], in[2]); };
  Tensor x1 = random_tensor({7}, 64).set_requires_grad(true);
  Tensor w1 = random_tensor({1, 7}, 65).set_requires_grad(true);
  Tensor b1 = random_tensor({1}, 66).set_requires_grad(true);
  gradcheck("linear 1-D", f, {x1, w1, b1});
}

TEST_CASE("linear: FP16/BF16 forward and backward", "[gemm]") {
  const Tensor x = random_tensor({4, 3, 40}, 71);
  const Tensor w = random_tensor({9, 40}, 72);
  const Tensor bias = random_tensor({9}, 73);
  const auto f = [](const std::vector<Tensor>& in) { return ops::linear(in[0], in[1], in[2]); };
  for (DType dtype : {DType::F16, DType::BF16}) {
    check_low_precision("linear", f, {x, w, bias}, dtype, 4.0);
    const double rtol = low_precision_rtol(dtype);
    check_low_precision_grads("linear", f, {x, w, bias}, random_tensor({4, 3, 9}, 74), dtype,
                              rtol, {4 * rtol, 4 * rtol, 4 * rtol});
  }
}

TEST_CASE("linear: bad inputs name the op, shapes and dtypes", "[gemm]") {
  const Tensor x = Tensor::zeros({2, 5});
  const Tensor w = Tensor::zeros({3, 5});
  REQUIRE_THROWS_WITH(ops::linear(x, Tensor::zeros({3, 4})), Catch::Contains("linear") &&
                                                                 Catch::Contains("F32[2, 5]") &&
                                                                 Catch::Contains("F32[3, 4]"));
  REQUIRE_THROWS_WITH(ops::linear(x, Tensor::zeros({5})), Catch::Contains("linear") &&
                                                              Catch::Contains("2-D") &&
                                                              Catch::Contains("F32[5]"));
  REQUIRE_THROWS_WITH(ops::linear(x, w, Tensor::zeros({5})), Catch::Contains("linear") &&
                                                                 Catch::Contains("bias") &&
                                                                 Catch::Contains("[3]"));
  REQUIRE_THROWS_WITH(ops::linear(x, w.to(DType::BF16)), Catch::Contains("linear") &&
                                                             Catch::Contains("BF16[3, 5]") &&
                                                             Catch::Contains("dtype"));
  REQUIRE_THROWS_WITH(ops::linear(Tensor(), w),
                      Catch::Contains("linear") && Catch::Contains("undefined"));
  REQUIRE_THROWS_WITH(ops::linear(Tensor::zeros({0, 5}), w),
                      Catch::Contains("linear") && Catch::Contains("empty"));
  REQUIRE_THROWS_WITH(
      ops::linear(Tensor::zeros({2, 5}, DType::I32), Tensor::zeros({3, 5}, DType::I32)),
      Catch::Contains("linear") && Catch::Contains("I32[2, 5]"));
}
