// cross_entropy and mse_loss: forward against double references, stability, analytic
// gradients, mse_loss's F16/BF16 gradient symmetry, and input validation (finite-difference
// gradients and F16/BF16 against F32: the op table, tests/ops/).
#include <cmath>
#include <vector>

#include "core/autograd/grad_mode.h"
#include "gradcheck.h"

namespace mixprec {
namespace {

using Catch::Contains;
using namespace testing;

Tensor labels_for(int64_t n, int64_t c, uint64_t seed) {
  std::vector<int32_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>((i * 7 + seed) % c);
  return Tensor::from_ints(v, {n});
}

double reference_cross_entropy(const std::vector<float>& x, const std::vector<int32_t>& labels,
                               int64_t c) {
  double total = 0;
  const int64_t n = static_cast<int64_t>(labels.size());
  for (int64_t r = 0; r < n; ++r) {
    double m = -INFINITY;
    for (int64_t j = 0; j < c; ++j) m = std::max(m, (double)x[r * c + j]);
    double s = 0;
    for (int64_t j = 0; j < c; ++j) s += std::exp(x[r * c + j] - m);
    total += m + std::log(s) - x[r * c + labels[r]];
  }
  return total / n;
}

TEST_CASE("cross_entropy matches a double reference", "[nn][cross_entropy]") {
  for (auto [n, c] : {std::pair<int64_t, int64_t>{5, 7}, {1, 3}, {13, 1}, {8, 32}}) {
    const Tensor logits = random_tensor({n, c}, 3 + n, -5.f, 5.f);
    const Tensor labels = labels_for(n, c, 2);
    const Tensor loss = ops::cross_entropy(logits, labels);
    REQUIRE(loss.dtype() == DType::F32);
    REQUIRE(loss.numel() == 1);
    CHECK(loss.item() == Approx(reference_cross_entropy(logits.to_float_vector(),
                                                        labels.to_int_vector(), c))
                             .epsilon(1e-5)
                             .margin(1e-6));
  }
}

TEST_CASE("cross_entropy is stable for large logits", "[nn][cross_entropy]") {
  const Tensor labels = Tensor::from_ints({2, 0}, {2});
  const Tensor big = Tensor::from_vector({1e4f, 1e4f + 1, 1e4f + 2, -1e4f, -1e4f - 1, -1e4f + 50},
                                         {2, 3});
  const Tensor small = Tensor::from_vector({0.f, 1.f, 2.f, 0.f, -1.f, 50.f}, {2, 3});
  const double expected = reference_cross_entropy(small.to_float_vector(), {2, 0}, 3);
  CHECK(ops::cross_entropy(big, labels).item() == Approx(expected).epsilon(1e-5));
  CHECK(ops::cross_entropy(small, labels).item() == Approx(expected).epsilon(1e-6));
  // F16 logits near the top of the range still give a finite, exact-enough loss.
  const Tensor big16 = Tensor::from_vector({60000.f, 59968.f}, {1, 2}, DType::F16);
  const Tensor label0 = Tensor::from_ints({1}, {1});
  CHECK(ops::cross_entropy(big16, label0).item() == Approx(32.0 + std::log1p(std::exp(-32.0))));
}

TEST_CASE("cross_entropy keeps full precision far from zero", "[nn][cross_entropy]") {
  // Logits (c, c - 1) with label 0: loss log(1 + e^-1) and gradient (p - 1, 1 - p) with
  // p = 1 / (1 + e^-1), whatever c. Folding the row maximum into an FP32 log-sum-exp first
  // would lose digits in proportion to c (7e-4 relative at c = 1e4).
  const double loss = std::log1p(std::exp(-1.0));
  const double p = 1.0 / (1.0 + std::exp(-1.0));
  const Tensor label0 = Tensor::from_ints({0}, {1});
  for (float c : {0.f, 1000.f, 10000.f, -30000.f}) {
    Tensor logits = Tensor::from_vector({c, c - 1}, {1, 2});
    logits.set_requires_grad(true);
    const Tensor l = ops::cross_entropy(logits, label0);
    INFO("logits (" << c << ", " << c - 1 << ")");
    CHECK(l.item() == Approx(loss).epsilon(1e-6));
    l.backward();
    CHECK(logits.grad().get(0) == Approx(p - 1).epsilon(1e-6));
    CHECK(logits.grad().get(1) == Approx(1 - p).epsilon(1e-6));
  }
}

// The analytic form (softmax - onehot) / N; the finite differences are the op table's.
TEST_CASE("cross_entropy gradient is (softmax - onehot) / N", "[nn][cross_entropy]") {
  Tensor logits = Tensor::from_vector({1.f, 2.f, 3.f, 0.f, 0.f, 0.f}, {2, 3}).set_requires_grad(true);
  ops::cross_entropy(logits, Tensor::from_ints({2, 0}, {2})).backward();
  const double s = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  const std::vector<float> g = logits.grad().to_float_vector();
  CHECK(g[0] == Approx(std::exp(1.0) / s / 2));
  CHECK(g[2] == Approx((std::exp(3.0) / s - 1) / 2));
  CHECK(g[3] == Approx((1.0 / 3 - 1) / 2));
  CHECK(g[4] == Approx(1.0 / 6));
}

TEST_CASE("cross_entropy rejects bad input", "[nn][cross_entropy]") {
  const Tensor logits = random_tensor({4, 5}, 1);
  REQUIRE_THROWS_WITH(ops::cross_entropy(logits, Tensor::zeros({4})),
                      Contains("cross_entropy") && Contains("labels") && Contains("F32[4]"));
  REQUIRE_THROWS_WITH(
      ops::cross_entropy(logits, Tensor::from_ints({0, 1, 7, 2}, {4})),
      Contains("cross_entropy") && Contains("7") && Contains("index 2") && Contains("[0, 5)"));
  REQUIRE_THROWS_WITH(
      ops::cross_entropy(logits, Tensor::from_ints({0, -1, 1, 2}, {4})),
      Contains("cross_entropy") && Contains("-1") && Contains("index 1"));
  REQUIRE_THROWS_WITH(ops::cross_entropy(logits, Tensor::from_ints({0, 1}, {2})),
                      Contains("cross_entropy") && Contains("I32[2]") && Contains("F32[4, 5]"));
  REQUIRE_THROWS_WITH(ops::cross_entropy(random_tensor({20}, 1), labels_for(4, 5, 0)),
                      Contains("cross_entropy") && Contains("F32[20]"));
  REQUIRE_THROWS_WITH(ops::cross_entropy(labels_for(4, 5, 0), labels_for(4, 5, 0)),
                      Contains("cross_entropy") && Contains("I32[4]"));
  REQUIRE_THROWS_WITH(ops::cross_entropy(logits, Tensor()),
                      Contains("cross_entropy") && Contains("undefined"));
}

TEST_CASE("mse_loss matches a double reference", "[nn][mse_loss]") {
  for (const Shape& shape : {Shape{3, 7}, Shape{13}, Shape{1}, Shape{2, 3, 5}}) {
    const Tensor a = random_tensor(shape, 5, -2.f, 2.f);
    const Tensor b = random_tensor(shape, 6, -2.f, 2.f);
    const Tensor loss = ops::mse_loss(a, b);
    REQUIRE(loss.dtype() == DType::F32);
    REQUIRE(loss.numel() == 1);
    const std::vector<float> va = a.to_float_vector(), vb = b.to_float_vector();
    double ref = 0;
    for (size_t i = 0; i < va.size(); ++i) ref += ((double)va[i] - vb[i]) * ((double)va[i] - vb[i]);
    CHECK(loss.item() == Approx(ref / va.size()).epsilon(1e-6));
  }
}

// Only one input needing a gradient; the finite differences are the op table's.
TEST_CASE("mse_loss gradient to one input only is 2 (a - b) / N", "[nn][mse_loss]") {
  Tensor a = random_tensor({4}, 10).set_requires_grad(true);
  const Tensor target = random_tensor({4}, 11);
  ops::mse_loss(a, target).backward();
  for (int64_t i = 0; i < 4; ++i)
    CHECK(a.grad().get(i) == Approx(2.0 / 4 * (a.get(i) - target.get(i))));
}

// The op table compares the F16/BF16 loss and gradients with F32 within a tolerance; the
// two inputs' gradients are also exact opposites, which a shared rounding must keep.
TEST_CASE("mse_loss gradients in F16 and BF16 are exact opposites", "[nn][mse_loss]") {
  const Tensor a = random_tensor({5, 9}, 12, -2.f, 2.f), b = random_tensor({5, 9}, 13, -2.f, 2.f);
  for (DType dtype : {DType::F16, DType::BF16}) {
    Tensor al = a.to(dtype).set_requires_grad(true), bl = b.to(dtype).set_requires_grad(true);
    Tensor loss = ops::mse_loss(al, bl);
    REQUIRE(loss.dtype() == DType::F32);
    loss.backward();
    REQUIRE(al.grad().dtype() == dtype);
    REQUIRE(bl.grad().dtype() == dtype);
    for (int64_t i = 0; i < al.numel(); ++i) CHECK(al.grad().get(i) == -bl.grad().get(i));
  }
}

TEST_CASE("mse_loss rejects bad input", "[nn][mse_loss]") {
  const Tensor a = random_tensor({3, 4}, 1);
  REQUIRE_THROWS_WITH(ops::mse_loss(a, random_tensor({4, 3}, 2)),
                      Contains("mse_loss") && Contains("F32[3, 4]") && Contains("F32[4, 3]"));
  REQUIRE_THROWS_WITH(ops::mse_loss(a, a.to(DType::F16)),
                      Contains("mse_loss") && Contains("F16[3, 4]"));
  REQUIRE_THROWS_WITH(ops::mse_loss(a, labels_for(3, 4, 0)),
                      Contains("mse_loss") && Contains("I32[3]"));
  REQUIRE_THROWS_WITH(ops::mse_loss(Tensor(), a), Contains("mse_loss") && Contains("undefined"));
}

}  // namespace
}  // namespace mixprec
