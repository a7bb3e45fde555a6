// Elementwise ops and primitives: the shared per-element math (core/math/elementwise.h),
// unary activations, scalar ops, broadcasting binary ops, and the CPU backend's binary,
// expand and causal_mask kernels (including their parallel and fast paths), each against a
// double-precision reference; their gradients and F16/BF16 results are the op table's
// (tests/ops/op_table.h), save the edge cases below.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/autograd/grad_mode.h"
#include "core/backend.h"
#include "core/math/elementwise.h"
#include "core/math/exp.h"
#include "gradcheck.h"

namespace mixprec {
namespace {

using namespace testing;

// Flat index into `in` of the element that broadcasts to output element `flat` of `out`.
int64_t broadcast_source(int64_t flat, const Shape& out, const Shape& in) {
  const std::vector<int64_t> c = coords_of(flat, out);
  int64_t index = 0;
  const size_t lead = out.size() - in.size();
  for (size_t d = 0; d < in.size(); ++d) index = index * in[d] + (in[d] == 1 ? 0 : c[lead + d]);
  return index;
}

// Values uniformly in [-high, -low] U [low, high]: away from the kinks of relu and abs.
Tensor away_from_zero(const Shape& shape, uint64_t seed, float low, float high) {
  const std::vector<float> u = random_tensor(shape, seed, -1.f, 1.f).to_float_vector();
  std::vector<float> v(u.size());
  for (size_t i = 0; i < u.size(); ++i)
    v[i] = (u[i] < 0 ? -1.f : 1.f) * (low + (high - low) * std::abs(u[i]));
  return Tensor::from_vector(v, shape);
}

// ---- shared per-element math ---------------------------------------------------------------

double gelu_reference(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

TEST_CASE("elementwise math: gelu, its derivative and sigmoid against double references",
          "[elementwise]") {
  for (double x = -6.0; x <= 6.0; x += 0.0625) {
    INFO("x = " << x);
    CHECK(gelu_tanh(static_cast<float>(x)) == Approx(gelu_reference(x)).margin(1e-6));
    const double h = 1e-5;
    const double slope = (gelu_reference(x + h) - gelu_reference(x - h)) / (2 * h);
    // tanh_rational is exactly -1 below u = -7.9 where tanh is 1 - 2.7e-7, which costs up
    // to 4e-6 of gelu's slope in its far negative tail (where the slope itself is ~1e-6).
    CHECK(gelu_tanh_derivative(static_cast<float>(x)) == Approx(slope).margin(5e-6));
    CHECK(stable_sigmoid(static_cast<float>(x)) == Approx(1 / (1 + std::exp(-x))).margin(1e-7));
  }
  // The stable form neither overflows nor loses the tiny tail.
  CHECK(stable_sigmoid(-80.f) == Approx(std::exp(-80.0)).epsilon(1e-5));
  CHECK(stable_sigmoid(100.f) == 1.0f);
  CHECK(std::isfinite(stable_sigmoid(-1000.f)));
  CHECK(std::isfinite(gelu_tanh_derivative(-30.f)));
  CHECK(gelu_tanh(-30.f) == Approx(0.0).margin(1e-12));
}

TEST_CASE("elementwise math: tanh_rational is within 3e-7 of tanh and bounded by 1",
          "[elementwise]") {
  double worst = 0;
  float worst_at = 0;
  bool bounded = true, odd = true;
  for (double x = -12.0; x <= 12.0; x += 1.0 / 4096) {
    const float xf = static_cast<float>(x);
    const float t = tanh_rational(xf);
    const double err = std::abs(t - std::tanh(static_cast<double>(xf)));
    if (err > worst) {
      worst = err;
      worst_at = xf;
    }
    bounded = bounded && std::abs(t) <= 1.0f;
    odd = odd && tanh_rational(-xf) == -t;
  }
  INFO("worst error " << worst << " at " << worst_at);
  CHECK(worst <= 3e-7);
  CHECK(bounded);
  CHECK(odd);
  CHECK(tanh_rational(1e-5f) == 1e-5f);
  CHECK(tanh_rational(INFINITY) == 1.0f);
  CHECK(tanh_rational(-INFINITY) == -1.0f);
  CHECK(std::isnan(tanh_rational(NAN)));
  CHECK(std::isnan(gelu_tanh(NAN)));
}

// exp_vectorisable over a stride of every float whose exp is neither 0 nor infinite, against
// double exp: error in units in the last place of the exact value, or in units of the
// smallest subnormal where the exact value is below FP32's normals.
TEST_CASE("elementwise math: exp_vectorisable is within 1.5 ulp of exp", "[elementwise]") {
  double worst = 0, worst_subnormal = 0;
  float worst_at = 0;
  int64_t checked = 0;
  const auto check = [&](float x) {
    const double exact = std::exp(static_cast<double>(x));
    const double err = std::abs(static_cast<double>(exp_vectorisable(x)) - exact);
    ++checked;
    if (exact < 0x1p-126) {
      worst_subnormal = std::max(worst_subnormal, err / 0x1p-149);
      return;
    }
    int e = 0;
    std::frexp(exact, &e);
    const double ulps = err / std::ldexp(1.0, e - 24);
    if (ulps > worst) {
      worst = ulps;
      worst_at = x;
    }
  };
  // Positive floats up to 88.7 (exp below FP32's largest value), negative ones down to -103.
  for (const float end : {88.7f, -103.0f}) {
    uint32_t last = 0;
    std::memcpy(&last, &end, sizeof last);
    for (uint32_t u = last & 0x80000000u; u <= last; u += 251) {
      float x = 0;
      std::memcpy(&x, &u, sizeof x);
      check(x);
    }
  }
  INFO("worst " << worst << " ulp at " << worst_at << "; subnormal results within "
                << worst_subnormal << " of 2^-149; " << checked << " values");
  CHECK(checked > 8000000);
  CHECK(worst <= 1.5);
  CHECK(worst_subnormal <= 1.0);
  // The largest softmax term, exp(0), is exactly 1; the ends are exact.
  CHECK(exp_vectorisable(0.0f) == 1.0f);
  CHECK(exp_vectorisable(-0.0f) == 1.0f);
  CHECK(exp_vectorisable(-104.5f) == 0.0f);
  CHECK(exp_vectorisable(-INFINITY) == 0.0f);
  CHECK(exp_vectorisable(88.73f) == INFINITY);
  CHECK(exp_vectorisable(1000.0f) == INFINITY);
  CHECK(exp_vectorisable(INFINITY) == INFINITY);
  CHECK(std::isnan(exp_vectorisable(NAN)));
  CHECK(exp_vectorisable(88.72f) < INFINITY);
}

TEST_CASE("elementwise math: derivatives match finite differences of the forward",
          "[elementwise]") {
  const std::vector<UnaryOp> ops_list = {UnaryOp::Exp,  UnaryOp::Log,  UnaryOp::Sqrt,
                                         UnaryOp::Square, UnaryOp::Relu, UnaryOp::Gelu,
                                         UnaryOp::Sigmoid, UnaryOp::Tanh};
  for (UnaryOp op : ops_list) {
    for (float x : {-1.7f, -0.6f, 0.3f, 0.9f, 2.2f}) {
      if ((op == UnaryOp::Log || op == UnaryOp::Sqrt) && x <= 0) continue;
      const float h = 1e-2f;
      const double numeric =
          (double(unary_value(op, x + h)) - double(unary_value(op, x - h))) / (2.0 * h);
      const float y = unary_value(op, x);
      INFO("op " << static_cast<int>(op) << " at " << x);
      CHECK(unary_grad(op, x, y, 1.5f) == Approx(1.5 * numeric).epsilon(2e-3).margin(1e-4));
    }
  }
  CHECK(unary_grad(UnaryOp::Relu, 0.f, 0.f, 1.f) == 0.f);
  CHECK(binary_value(BinaryOp::Sub, 3.f, 5.f) == -2.f);
  CHECK(binary_value(BinaryOp::Div, 3.f, 4.f) == 0.75f);
}

// ---- unary ops ---------------------------------------------------------------------------

struct UnaryCase {
  const char* name;
  std::function<Tensor(const Tensor&)> op;
  std::function<double(double)> reference;
  float low, high;  // input magnitudes; signed unless `positive`
  bool positive;
};

std::vector<UnaryCase> unary_cases() {
  return {
      {"exp", [](const Tensor& x) { return ops::exp(x); }, [](double x) { return std::exp(x); },
       0.f, 2.f, false},
      {"log", [](const Tensor& x) { return ops::log(x); }, [](double x) { return std::log(x); },
       0.3f, 3.f, true},
      {"sqrt", [](const Tensor& x) { return ops::sqrt(x); },
       [](double x) { return std::sqrt(x); }, 0.3f, 3.f, true},
      {"square", [](const Tensor& x) { return ops::square(x); }, [](double x) { return x * x; },
       0.f, 2.f, false},
      {"relu", [](const Tensor& x) { return ops::relu(x); },
       [](double x) { return x > 0 ? x : 0.0; }, 0.05f, 2.f, false},
      {"gelu", [](const Tensor& x) { return ops::gelu(x); }, gelu_reference, 0.f, 3.f, false},
      {"sigmoid", [](const Tensor& x) { return ops::sigmoid(x); },
       [](double x) { return 1 / (1 + std::exp(-x)); }, 0.f, 4.f, false},
      {"tanh", [](const Tensor& x) { return ops::tanh(x); },
       [](double x) { return std::tanh(x); }, 0.f, 2.f, false},
  };
}

Tensor unary_input(const UnaryCase& c, const Shape& shape, uint64_t seed) {
  if (c.positive) return random_tensor(shape, seed, c.low, c.high);
  return away_from_zero(shape, seed, c.low, c.high);
}

TEST_CASE("unary ops match a double reference", "[elementwise]") {
  for (const UnaryCase& c : unary_cases()) {
    for (const Shape& shape : {Shape{3, 7}, Shape{13}, Shape{1}, Shape{2, 1, 5}}) {
      const Tensor x = unary_input(c, shape, 7 + shape.size());
      const Tensor y = c.op(x);
      REQUIRE(y.shape() == shape);
      REQUIRE(y.dtype() == DType::F32);
      const std::vector<float> xv = x.to_float_vector(), yv = y.to_float_vector();
      for (size_t i = 0; i < xv.size(); ++i) {
        INFO(c.name << "(" << xv[i] << ")");
        CHECK(yv[i] == Approx(c.reference(xv[i])).epsilon(1e-6).margin(1e-6));
      }
    }
  }
}

TEST_CASE("relu rounds an F16 input once and keeps negative zero out", "[elementwise]") {
  const Tensor x = Tensor::from_vector({-2.f, -0.f, 0.f, 1e-7f, 65504.f}, {5}, DType::F16);
  const Tensor y = ops::relu(x);
  REQUIRE(y.dtype() == DType::F16);
  const std::vector<float> v = y.to_float_vector();
  CHECK(v[0] == 0.f);
  CHECK(v[1] == 0.f);
  CHECK(!std::signbit(v[1]));
  CHECK(v[3] == Approx(1.19209e-7).epsilon(1e-2));  // an F16 subnormal survives
  CHECK(v[4] == 65504.f);
}

TEST_CASE("unary ops reject bad input with the op's name", "[elementwise]") {
  const Tensor ids = Tensor::from_ints(std::vector<int32_t>{1, 2, 3}, Shape{3});
  REQUIRE_THROWS_WITH(ops::relu(ids), Catch::Contains("relu") && Catch::Contains("I32[3]"));
  REQUIRE_THROWS_WITH(ops::exp(Tensor()), Catch::Contains("exp") && Catch::Contains("undefined"));
  REQUIRE_THROWS_WITH(ops::gelu(Tensor::empty({0, 4})),
                      Catch::Contains("gelu") && Catch::Contains("[0, 4]") &&
                          Catch::Contains("empty"));
}

// ---- scalar ops -----------------------------------------------------------------------------

// Their gradients and F16/BF16 results are the op table's (tests/ops/op_table.h).
TEST_CASE("scalar ops: forward and bad input", "[elementwise]") {
  const Tensor x = random_tensor({3, 7}, 41, -2.f, 2.f);
  const std::vector<float> xv = x.to_float_vector();
  const std::vector<float> a = ops::add_scalar(x, 0.75).to_float_vector();
  const std::vector<float> m = ops::mul_scalar(x, -2.5).to_float_vector();
  const std::vector<float> n = ops::neg(x).to_float_vector();
  const std::vector<float> d = (x / 4.0).to_float_vector();
  const std::vector<float> s = (1.5 * x - 1.0).to_float_vector();
  for (size_t i = 0; i < xv.size(); ++i) {
    CHECK(a[i] == Approx(xv[i] + 0.75));
    CHECK(m[i] == Approx(xv[i] * -2.5));
    CHECK(n[i] == -xv[i]);
    CHECK(d[i] == Approx(xv[i] / 4.0));
    CHECK(s[i] == Approx(1.5 * xv[i] - 1.0));
  }
  REQUIRE_THROWS_WITH(ops::mul_scalar(Tensor::from_ints(std::vector<int32_t>{1}, Shape{1}), 2.0),
                      Catch::Contains("mul_scalar") && Catch::Contains("I32"));
  REQUIRE_THROWS_WITH(ops::neg(Tensor()), Catch::Contains("neg"));
}

// ---- binary ops ---------------------------------------------------------------------------

struct BinaryCase {
  const char* name;
  std::function<Tensor(const Tensor&, const Tensor&)> op;
  std::function<double(double, double)> reference;
};

std::vector<BinaryCase> binary_cases() {
  return {
      {"add", [](const Tensor& a, const Tensor& b) { return a + b; },
       [](double a, double b) { return a + b; }},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; },
       [](double a, double b) { return a - b; }},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; },
       [](double a, double b) { return a * b; }},
      {"div", [](const Tensor& a, const Tensor& b) { return a / b; },
       [](double a, double b) { return a / b; }},
  };
}

// Pairs of shapes covering the kernel's paths: equal shapes, a trailing bias, a leading
// bias on the left operand, [N, 1] columns, broadcasting on both sides, scalars.
const std::vector<std::pair<Shape, Shape>>& broadcast_pairs() {
  static const std::vector<std::pair<Shape, Shape>> pairs = {
      {{3, 7}, {3, 7}},    {{5, 7}, {7}},          {{2, 3, 5}, {3, 5}}, {{7}, {5, 7}},
      {{4, 3}, {4, 1}},    {{3, 1, 5}, {4, 1}},    {{3, 1}, {1, 4}},    {{2, 3}, {}},
      {{}, {2, 3}},        {{1, 1, 13}, {13}},     {{2, 1, 3, 1}, {1, 4, 1, 5}}, {{1}, {1}},
  };
  return pairs;
}

// b is kept away from zero so that div is smooth.
Tensor binary_rhs(const Shape& shape, uint64_t seed) { return away_from_zero(shape, seed, 0.5f, 1.5f); }

TEST_CASE("binary ops broadcast like NumPy and match a double reference", "[elementwise]") {
  for (const BinaryCase& c : binary_cases()) {
    for (const auto& [sa, sb] : broadcast_pairs()) {
      const Tensor a = random_tensor(sa, 51, -2.f, 2.f), b = binary_rhs(sb, 52);
      const Tensor y = c.op(a, b);
      const Shape out = broadcast_shapes(sa, sb, "test");
      REQUIRE(y.shape() == out);
      const std::vector<float> av = a.to_float_vector(), bv = b.to_float_vector(),
                               yv = y.to_float_vector();
      for (int64_t i = 0; i < shape_numel(out); ++i) {
        const double expect = c.reference(av[broadcast_source(i, out, sa)],
                                          bv[broadcast_source(i, out, sb)]);
        INFO(c.name << " " << shape_str(sa) << " with " << shape_str(sb) << " at " << i);
        CHECK(yv[i] == Approx(expect).epsilon(1e-6).margin(1e-6));
      }
    }
  }
}

TEST_CASE("binary ops with a single-element operand on either side, bit for bit",
          "[elementwise]") {
  // The constant operand takes its own kernel path; sizes straddle its 512-element
  // conversion blocks and reach the parallel split. Expected: the op in double on the
  // stored values, rounded to FP32 and then once to the dtype.
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    for (int64_t n : {2, 511, 512, 513, 1543, 40007}) {
      const Tensor x = binary_rhs({n}, 53).to(dtype);
      const std::vector<float> xv = x.to_float_vector();
      for (const Shape& scalar_shape : {Shape{}, Shape{1}, Shape{1, 1}}) {
        const Tensor s = Tensor::full(scalar_shape, -0.3, dtype);
        const float sv = s.to_float_vector()[0];
        for (const BinaryCase& c : binary_cases()) {
          for (bool scalar_right : {true, false}) {
            const Tensor y = scalar_right ? c.op(x, s) : c.op(s, x);
            const Shape out = broadcast_shapes(x.shape(), scalar_shape, "test");
            REQUIRE(y.shape() == out);
            REQUIRE(y.dtype() == dtype);
            std::vector<float> expect(static_cast<size_t>(n));
            for (int64_t i = 0; i < n; ++i)
              expect[i] = static_cast<float>(scalar_right ? c.reference(xv[i], sv)
                                                          : c.reference(sv, xv[i]));
            const std::vector<float> rounded =
                Tensor::from_vector(expect, out, dtype).to_float_vector();
            const std::vector<float> yv = y.to_float_vector();
            int64_t bad = 0;
            for (int64_t i = 0; i < n; ++i) bad += yv[i] == rounded[i] ? 0 : 1;
            INFO(c.name << " in " << dtype << ", n = " << n << ", scalar "
                        << shape_str(scalar_shape)
                        << (scalar_right ? " on the right" : " on the left"));
            CHECK(bad == 0);
          }
        }
      }
    }
  }
}

TEST_CASE("binary ops with a bias over the trailing dims, bit for bit", "[elementwise]") {
  // Short biases are tiled into whole 512-element blocks and long ones run row by row; both
  // must equal the op in double on the stored values, rounded once to the dtype.
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    for (const auto& [rows, nb] : std::vector<std::pair<int64_t, int64_t>>{
             {1, 1}, {3, 2}, {1000, 3}, {257, 7}, {9, 100}, {5, 511}, {40, 512}, {3, 600}}) {
      const Tensor x = binary_rhs({rows, nb}, 81).to(dtype);
      const Tensor bias = binary_rhs({nb}, 82).to(dtype);
      const std::vector<float> xv = x.to_float_vector(), bv = bias.to_float_vector();
      for (const BinaryCase& c : binary_cases()) {
        const Tensor y = c.op(x, bias);
        std::vector<float> expect(xv.size());
        for (size_t i = 0; i < xv.size(); ++i)
          expect[i] = static_cast<float>(c.reference(xv[i], bv[i % nb]));
        const std::vector<float> rounded = Tensor::from_vector(expect, x.shape(), dtype).to_float_vector();
        const std::vector<float> yv = y.to_float_vector();
        int64_t bad = 0;
        for (size_t i = 0; i < yv.size(); ++i) bad += yv[i] == rounded[i] ? 0 : 1;
        INFO(c.name << " in " << dtype << ", [" << rows << ", " << nb << "] with a bias of " << nb);
        CHECK(bad == 0);
      }
    }
  }
}

TEST_CASE("binary ops: gradient to one operand only, and the same tensor on both sides",
          "[elementwise]") {
  for (const BinaryCase& c : binary_cases()) {
    Tensor a = random_tensor({4, 3}, 71, -1.f, 1.f).set_requires_grad(true);
    const Tensor b = binary_rhs({3}, 72);
    c.op(a, b).backward(Tensor::ones({4, 3}));
    REQUIRE(a.grad().defined());
    CHECK(a.grad().shape() == Shape{4, 3});
    CHECK(!b.grad().defined());

    Tensor u = binary_rhs({5}, 73).set_requires_grad(true);
    gradcheck(std::string(c.name) + " self",
              [&c](const std::vector<Tensor>& in) { return c.op(in[0], in[0]); }, {u});
  }
}

TEST_CASE("div and mul gradients in F16 round once, without false overflow", "[elementwise]") {
  SECTION("div: db = -g a / b^2 fits in F16 although g / b does not") {
    const Tensor a = Tensor::scalar(1e-4, DType::F16);
    Tensor b = Tensor::scalar(0.01, DType::F16).set_requires_grad(true);
    ops::div(a, b).backward(Tensor::scalar(30000, DType::F16));
    REQUIRE(b.grad().dtype() == DType::F16);
    // On the stored values: -30000 * 1.00017e-4 / 0.0100021^2 = -29992.3, which rounds to
    // -30000 in F16; g / b = 3e6 alone would be out of range.
    const double av = a.item(), bv = b.item();
    const double exact = -30000.0 * av / (bv * bv);
    CHECK(Tensor::scalar(exact, DType::F16).item() == -30000.0);
    CHECK(b.grad().item() == -30000.0);
  }
  SECTION("mul: the broadcast operand's gradient sums the products before rounding") {
    // ga = sum_i g[i] * b[i] over the broadcast dim.
    const auto grad_of_a = [](const std::vector<float>& g, const std::vector<float>& bv) {
      Tensor a = Tensor::ones({1}, DType::F16).set_requires_grad(true);
      const Shape shape{static_cast<int64_t>(bv.size())};
      const Tensor b = Tensor::from_vector(bv, shape, DType::F16);
      ops::mul(a, b).backward(Tensor::from_vector(g, shape, DType::F16));
      REQUIRE(a.grad().dtype() == DType::F16);
      return a.grad().item();
    };
    // Products 120000 and -90000 are beyond F16's 65504; their sum 30000 is not.
    CHECK(grad_of_a({60000, 60000}, {2, -1.5}) == 30000.0);
    // (1 + 2^-10)^2 = 1 + 2^-9 + 2^-20 and 1 - 2^-10 sum to 2 + 2^-10 + 2^-20, just above
    // the midpoint between F16 neighbours 2 and 2 + 2^-9, so it rounds up. Rounding the
    // first product first drops the 2^-20 and leaves the tie, which rounds to even (2).
    const float up = 1.0009765625f, down = 0.9990234375f;
    const double exact = static_cast<double>(up) * up + down;
    CHECK(Tensor::scalar(exact, DType::F16).item() == 2.001953125);
    CHECK(grad_of_a({up, 1}, {up, down}) == 2.001953125);
  }
  SECTION("results equal the FP32 gradients rounded once, broadcast on both sides") {
    for (BinaryOp op : {BinaryOp::Mul, BinaryOp::Div}) {
      for (DType dtype : {DType::F16, DType::BF16}) {
        const auto f = [op](const Tensor& u, const Tensor& v) {
          return op == BinaryOp::Mul ? ops::mul(u, v) : ops::div(u, v);
        };
        const Tensor a0 = random_tensor({5, 1, 7}, 121, -2.f, 2.f, dtype);
        const Tensor b0 = binary_rhs({3, 1}, 122).to(dtype);
        const Tensor g0 = random_tensor({5, 3, 7}, 123, -50.f, 50.f, dtype);
        Tensor a = a0.clone().set_requires_grad(true), b = b0.clone().set_requires_grad(true);
        f(a, b).backward(g0);
        Tensor a32 = a0.to(DType::F32).set_requires_grad(true);
        Tensor b32 = b0.to(DType::F32).set_requires_grad(true);
        f(a32, b32).backward(g0.to(DType::F32));
        INFO((op == BinaryOp::Mul ? "mul" : "div") << " in " << dtype);
        CHECK(a.grad().to_float_vector() == a32.grad().to(dtype).to_float_vector());
        CHECK(b.grad().to_float_vector() == b32.grad().to(dtype).to_float_vector());
      }
    }
  }
}

TEST_CASE("binary ops reject bad input with the op's name, shapes and dtypes", "[elementwise]") {
  const Tensor f32 = Tensor::ones({2, 3});
  const Tensor f16 = Tensor::ones({2, 3}, DType::F16);
  const Tensor ids = Tensor::from_ints(std::vector<int32_t>{1, 2, 3, 4, 5, 6}, Shape{2, 3});
  REQUIRE_THROWS_WITH(ops::add(f32, f16), Catch::Contains("add") && Catch::Contains("F32[2, 3]") &&
                                              Catch::Contains("F16[2, 3]"));
  REQUIRE_THROWS_WITH(ops::mul(f32, Tensor::ones({4})),
                      Catch::Contains("mul") && Catch::Contains("[2, 3]") &&
                          Catch::Contains("[4]") && Catch::Contains("broadcast") &&
                          Catch::Contains("extents 3 and 4 in dimension -1"));
  REQUIRE_THROWS_WITH(ops::sub(Tensor::ones({3, 2, 2}), Tensor::ones({3, 2})),
                      Catch::Contains("sub") && Catch::Contains("[3, 2, 2]"));
  REQUIRE_THROWS_WITH(ops::div(ids, f32), Catch::Contains("div") && Catch::Contains("I32[2, 3]"));
  REQUIRE_THROWS_WITH(ops::add(f32, Tensor()), Catch::Contains("add") && Catch::Contains("undefined"));
  REQUIRE_THROWS_WITH(ops::mul(Tensor::empty({0, 3}), f32),
                      Catch::Contains("mul") && Catch::Contains("empty"));
}

// ---- backend primitives ------------------------------------------------------------------

TEST_CASE("backend binary: large tensors on every path, and out aliasing an input",
          "[elementwise]") {
  Backend& be = backend_for(kCPU);
  // Large enough to be split across threads and chunks; odd extents so that runs straddle
  // chunk boundaries.
  for (const auto& [sa, sb] : std::vector<std::pair<Shape, Shape>>{
           {{67, 1031}, {67, 1031}}, {{67, 1031}, {1031}}, {{67, 1, 1031}, {1, 3, 1}},
           {{1031}, {45, 1031}}, {{301, 1}, {1, 257}}, {{3, 97, 1}, {3, 1, 211}}}) {
    for (DType dtype : {DType::F32, DType::BF16}) {
      const Tensor a = random_tensor(sa, 91, -2.f, 2.f, dtype), b = random_tensor(sb, 92, -2.f, 2.f, dtype);
      const Shape out = broadcast_shapes(sa, sb, "test");
      Tensor y = Tensor::empty(out, dtype);
      be.binary(BinaryOp::Sub, a, b, y);
      const std::vector<float> av = a.to_float_vector(), bv = b.to_float_vector(),
                               yv = y.to_float_vector();
      std::vector<float> expect(yv.size());
      for (int64_t i = 0; i < shape_numel(out); ++i)
        expect[i] = av[broadcast_source(i, out, sa)] - bv[broadcast_source(i, out, sb)];
      // The FP32 difference rounded once to the dtype, bit for bit.
      const std::vector<float> rounded = Tensor::from_vector(expect, out, dtype).to_float_vector();
      int64_t bad = 0;
      for (size_t i = 0; i < yv.size(); ++i) bad += yv[i] == rounded[i] ? 0 : 1;
      INFO(shape_str(sa) << " - " << shape_str(sb) << " in " << dtype);
      CHECK(bad == 0);
    }
  }
  // The autograd engine accumulates gradients with out == a.
  Tensor acc = Tensor::full({50, 1000}, 1.0);
  const Tensor inc = random_tensor({50, 1000}, 93);
  be.binary(BinaryOp::Add, acc, inc, acc);
  require_close(acc, ops::add_scalar(inc, 1.0), 0, 1e-6, "in place");
  REQUIRE_THROWS_WITH(be.binary(BinaryOp::Add, Tensor::ones({2, 3}), Tensor::ones({3}), acc),
                      Catch::Contains("binary") && Catch::Contains("[50, 1000]"));
}

TEST_CASE("backend affine and expand", "[elementwise]") {
  Backend& be = backend_for(kCPU);
  const Tensor x = random_tensor({3, 1, 5}, 101);
  for (const Shape& out : {Shape{3, 4, 5}, Shape{2, 3, 1, 5}, Shape{3, 1, 5}, Shape{40, 3, 300, 5}}) {
    Tensor y = Tensor::empty(out);
    be.expand(x, y, -0.5f);
    const std::vector<float> xv = x.to_float_vector(), yv = y.to_float_vector();
    int64_t bad = 0;
    for (int64_t i = 0; i < shape_numel(out); ++i)
      bad += yv[i] == -0.5f * xv[broadcast_source(i, out, x.shape())] ? 0 : 1;
    INFO("expand to " << shape_str(out));
    CHECK(bad == 0);
  }
  Tensor y = Tensor::empty({3, 1, 5}, DType::F16);
  be.affine(x.to(DType::F16), 3.f, 0.25f, y);
  const std::vector<float> xv = x.to(DType::F16).to_float_vector(), yv = y.to_float_vector();
  for (size_t i = 0; i < xv.size(); ++i)
    CHECK(yv[i] == Tensor::scalar(3.f * xv[i] + 0.25f, DType::F16).to_float_vector()[0]);
  Tensor wrong = Tensor::empty({2, 5});
  REQUIRE_THROWS_WITH(be.expand(x, wrong, 1.f),
                      Catch::Contains("expand") && Catch::Contains("[3, 1, 5]") &&
                          Catch::Contains("[2, 5]"));
}

TEST_CASE("backend causal_mask keeps the lower triangle", "[elementwise]") {
  Backend& be = backend_for(kCPU);
  for (DType dtype : {DType::F32, DType::F16}) {
    for (const Shape& shape : {Shape{2, 3, 5, 5}, Shape{4, 7}, Shape{7, 4}}) {
      const Tensor x = random_tensor(shape, 111, -1.f, 1.f, dtype);
      Tensor y = Tensor::empty(shape, dtype);
      be.causal_mask(x, -INFINITY, y);
      const std::vector<float> xv = x.to_float_vector(), yv = y.to_float_vector();
      const int64_t rows = shape[shape.size() - 2], cols = shape.back();
      for (int64_t k = 0; k < x.numel(); ++k) {
        const int64_t i = (k / cols) % rows, j = k % cols;
        if (j > i) CHECK(yv[k] == -INFINITY);
        else CHECK(yv[k] == xv[k]);
      }
    }
  }
  Tensor inplace = Tensor::ones({3, 3});
  be.causal_mask(inplace, 0.f, inplace);
  CHECK(inplace.to_float_vector() == std::vector<float>{1, 0, 0, 1, 1, 0, 1, 1, 1});
  Tensor v = Tensor::empty({3});
  REQUIRE_THROWS_WITH(be.causal_mask(Tensor::ones({3}), 0.f, v),
                      Catch::Contains("causal_mask") && Catch::Contains("[3]"));
}

TEST_CASE("relu keeps NaN and passes its gradient, as PyTorch does", "[elementwise]") {
  Tensor x = Tensor::from_vector({NAN, -1.f, 2.f}, {3});
  x.set_requires_grad(true);
  const Tensor y = ops::relu(x);
  CHECK(std::isnan(y.get(0)));
  CHECK(y.get(1) == 0.0);
  CHECK(y.get(2) == 2.0);
  y.backward(Tensor::from_vector({5.f, 5.f, 5.f}, {3}));
  CHECK(x.grad().get(0) == 5.0);
  CHECK(x.grad().get(1) == 0.0);
  CHECK(x.grad().get(2) == 5.0);
}

}  // namespace
}  // namespace mixprec
