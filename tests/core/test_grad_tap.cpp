// grad_tap: the identity that shows its incoming gradient to a callback.
#include <vector>

#include "core/autograd/grad_mode.h"
#include "core/autograd/node.h"
#include "core/error.h"
#include "gradcheck.h"

using namespace mixprec;
using namespace mixprec::testing;

TEST_CASE("grad_tap is the identity in forward and a new node in the graph", "[grad_tap]") {
  Tensor x = random_tensor({2, 3}, 7);
  x.set_requires_grad(true);
  const Tensor y = ops::grad_tap(x, [](const Tensor&) {});
  CHECK_FALSE(y.is_same(x));
  CHECK(y.grad_fn() != nullptr);
  CHECK(y.grad_fn()->name() == "grad_tap");
  CHECK(y.requires_grad());
  REQUIRE(y.shape() == x.shape());
  CHECK(y.dtype() == x.dtype());
  CHECK(y.to_float_vector() == x.to_float_vector());
}

TEST_CASE("grad_tap hands the incoming gradient to its callback and passes it on",
          "[grad_tap]") {
  // L = sum(3 * tap(x * x) * c): the tap sees 3c, and x receives 3c * 2x.
  Tensor x = Tensor::from_vector({1.f, -2.f, 0.5f, 4.f}, {2, 2});
  x.set_requires_grad(true);
  const Tensor c = Tensor::from_vector({1.f, 2.f, -1.f, 0.25f}, {2, 2});
  std::vector<std::vector<float>> seen;
  Shape seen_shape;
  const Tensor tapped = ops::grad_tap(ops::mul(x, x), [&](const Tensor& g) {
    seen.push_back(g.to_float_vector());
    seen_shape = g.shape();
  });
  ops::sum(ops::mul(ops::mul_scalar(tapped, 3.0), c)).backward();
  REQUIRE(seen.size() == 1);
  CHECK(seen_shape == Shape{2, 2});
  CHECK(seen[0] == std::vector<float>{3.f, 6.f, -3.f, 0.75f});
  CHECK(x.grad().to_float_vector() == std::vector<float>{6.f, -24.f, -3.f, 6.f});
}

TEST_CASE("grad_tap leaves finite-difference gradients unchanged", "[grad_tap]") {
  Tensor x = random_tensor({3, 4}, 21);
  x.set_requires_grad(true);
  int calls = 0;
  gradcheck("grad_tap", [&](const std::vector<Tensor>& in) {
    return ops::square(ops::grad_tap(ops::tanh(in[0]), [&](const Tensor&) { ++calls; }));
  }, {x});
  CHECK(calls == 1);  // finite differences run without a backward
}

TEST_CASE("grad_tap sees the gradient in the working dtype", "[grad_tap]") {
  Tensor x = random_tensor({4}, 3);
  x.set_requires_grad(true);
  DType seen = DType::F32;
  std::vector<float> values;
  const Tensor half = ops::cast(x, DType::F16);
  const Tensor tapped = ops::grad_tap(half, [&](const Tensor& g) {
    seen = g.dtype();
    values = g.to_float_vector();
  });
  // Upstream gradient 2^-20: an FP16 subnormal, exactly representable.
  ops::sum(ops::mul_scalar(ops::cast(tapped, DType::F32), 0x1p-20)).backward();
  CHECK(seen == DType::F16);
  CHECK(values == std::vector<float>(4, 0x1p-20f));
  CHECK(x.grad().to_float_vector() == std::vector<float>(4, 0x1p-20f));
}

TEST_CASE("grad_tap records nothing when no gradient can arrive", "[grad_tap]") {
  const Tensor constant = random_tensor({3}, 5);
  bool called = false;
  const Tensor same = ops::grad_tap(constant, [&](const Tensor&) { called = true; });
  CHECK(same.is_same(constant));
  CHECK(same.grad_fn() == nullptr);

  Tensor x = random_tensor({3}, 6);
  x.set_requires_grad(true);
  {
    NoGradGuard no_grad;
    const Tensor untracked = ops::grad_tap(x, [&](const Tensor&) { called = true; });
    CHECK(untracked.is_same(x));
  }
  CHECK_FALSE(called);
}

TEST_CASE("grad_tap rejects an undefined input and an empty callback", "[grad_tap]") {
  CHECK_THROWS_AS(ops::grad_tap(Tensor(), [](const Tensor&) {}), Error);
  Tensor x = random_tensor({2}, 1);
  x.set_requires_grad(true);
  CHECK_THROWS_WITH(ops::grad_tap(x, nullptr), Catch::Contains("callback"));
}

TEST_CASE("grad_tap sees the sum when its output feeds two consumers", "[grad_tap]") {
  // L = sum(t * a) + sum(t * b): the gradient reaching the tap is a + b, summed by the engine
  // before the node runs.
  Tensor x = Tensor::from_vector({1.f, 2.f}, {2});
  x.set_requires_grad(true);
  const Tensor a = Tensor::from_vector({1.f, 10.f}, {2});
  const Tensor b = Tensor::from_vector({0.5f, -4.f}, {2});
  std::vector<std::vector<float>> seen;
  const Tensor t = ops::grad_tap(x, [&](const Tensor& g) { seen.push_back(g.to_float_vector()); });
  ops::add(ops::sum(ops::mul(t, a)), ops::sum(ops::mul(t, b))).backward();
  REQUIRE(seen.size() == 1);
  CHECK(seen[0] == std::vector<float>{1.5f, 6.f});
  CHECK(x.grad().to_float_vector() == std::vector<float>{1.5f, 6.f});
}
