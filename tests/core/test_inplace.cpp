// In-place writes to tensors saved for backward: every writer (fill_, copy_, set,
// mark_modified, the in-place .grad accumulation, batch_norm's running statistics) bumps the
// storage's version, and backward refuses to run a node whose saved tensors changed.
#include <catch2/catch.hpp>

#include "core/autograd/grad_mode.h"
#include "core/autograd/node.h"
#include "core/backend.h"
#include "core/ops/ops.h"
#include "core/tensor.h"

using namespace mixprec;

namespace {

Tensor leaf(double value) {
  Tensor t = Tensor::scalar(value);
  t.set_requires_grad(true);
  return t;
}

Tensor leaf(const std::vector<float>& values, const Shape& shape) {
  Tensor t = Tensor::from_vector(values, shape);
  t.set_requires_grad(true);
  return t;
}

}  // namespace

TEST_CASE("writing a saved input in place makes backward throw naming the op", "[inplace]") {
  Tensor x = leaf(3.0), w = leaf(2.0);

  Tensor y = ops::mul(x, w);
  w.fill_(100.0);
  REQUIRE_THROWS_WITH(y.backward(), Catch::Contains("'mul'") &&
                                        Catch::Contains("modified in place") &&
                                        Catch::Contains("version 0, now 1"));
  CHECK(!x.grad().defined());  // nothing was accumulated from the stale graph

  Tensor z;
  {
    LayerScope scope("block.3");
    z = ops::mul(x, w);
  }
  w.copy_(Tensor::scalar(5.0));
  REQUIRE_THROWS_WITH(z.backward(), Catch::Contains("'mul'") && Catch::Contains("block.3"));

  // Unmodified, the same graph runs: dL/dx = w.
  Tensor u = ops::mul(x, w);
  u.backward();
  CHECK(x.grad().item() == Approx(5.0));
  CHECK(w.grad().item() == Approx(3.0));
}

TEST_CASE("an input the backward does not read may be written in place", "[inplace]") {
  Tensor a = leaf({1.f, 2.f}, {2}), c = leaf({3.f, 4.f}, {2}), b = leaf({5.f, 6.f}, {2});

  // add saves neither operand; mul saves both a and c.
  Tensor y = ops::add(ops::mul(a, c), b);
  b.fill_(-7.0);
  y.backward(Tensor::ones({2}));
  CHECK(a.grad().to_float_vector() == std::vector<float>{3.f, 4.f});
  CHECK(c.grad().to_float_vector() == std::vector<float>{1.f, 2.f});
  CHECK(b.grad().to_float_vector() == std::vector<float>{1.f, 1.f});

  Tensor y2 = ops::add(ops::mul(a, c), b);
  c.set(1, 9.0);
  REQUIRE_THROWS_WITH(y2.backward(Tensor::ones({2})), Catch::Contains("'mul'"));
  // The failure comes before any gradient is summed: b's path alone would have been fine.
  CHECK(b.grad().to_float_vector() == std::vector<float>{1.f, 1.f});
  CHECK(a.grad().to_float_vector() == std::vector<float>{3.f, 4.f});
}

TEST_CASE("writes through a reshape view or a detach() of a saved tensor are caught",
          "[inplace]") {
  Tensor x = leaf({1.f, 2.f, 3.f, 4.f}, {2, 2});
  Tensor w = leaf({5.f, 6.f, 7.f, 8.f}, {2, 2});

  SECTION("through a reshape view of the saved tensor") {
    Tensor y = ops::matmul(x, w);
    Tensor flat = w.reshape({4});
    flat.set(2, 0.0);
    REQUIRE_THROWS_WITH(y.backward(Tensor::ones({2, 2})), Catch::Contains("'matmul'"));
  }
  SECTION("through a detach() of the saved tensor") {
    Tensor y = ops::matmul(x, w);
    w.detach().fill_(1.0);
    REQUIRE_THROWS_WITH(y.backward(Tensor::ones({2, 2})), Catch::Contains("'matmul'"));
  }
  SECTION("the saved tensor is itself a view, written through its base") {
    Tensor y = ops::mul(x.reshape({4}), w.reshape({4}));
    w.zero_();
    REQUIRE_THROWS_WITH(y.backward(Tensor::ones({4})), Catch::Contains("'mul'"));
  }
}

TEST_CASE("writing a saved output in place is caught", "[inplace]") {
  Tensor x = leaf({-1.f, 0.5f, 2.f}, {1, 3});

  SECTION("sigmoid") {
    Tensor y = ops::sigmoid(x);
    y.fill_(0.5);
    REQUIRE_THROWS_WITH(y.backward(Tensor::ones({1, 3})), Catch::Contains("'sigmoid'"));
  }
  SECTION("exp, read through a downstream op") {
    Tensor e = ops::exp(x);
    Tensor s = ops::sum(e);
    e.set(0, 0.0);
    REQUIRE_THROWS_WITH(s.backward(), Catch::Contains("'exp'"));
  }
  SECTION("softmax") {
    Tensor p = ops::softmax(x);
    Tensor l = ops::sum(ops::mul_scalar(p, 2.0));
    p.copy_(Tensor::full({1, 3}, 1.0 / 3.0));
    REQUIRE_THROWS_WITH(l.backward(), Catch::Contains("'softmax'"));
  }
}

TEST_CASE("an optimizer-style loop may write parameters after backward, not before",
          "[inplace]") {
  Tensor x = leaf(3.0), w = leaf(2.0);
  for (int step = 0; step < 3; ++step) {
    x.reset_grad();
    Tensor y = ops::mul(x, w);
    y.backward();
    CHECK(x.grad().item() == Approx(w.item()));  // the gradient used the forward's w
    w.set(0, w.item() - 0.5);                    // the "update", after backward
  }
  CHECK(w.item() == Approx(0.5));

  Tensor y = ops::mul(x, w);
  w.set(0, 10.0);  // an update before backward
  REQUIRE_THROWS_WITH(y.backward(), Catch::Contains("'mul'"));
}

TEST_CASE("mark_modified reports a write made through a Backend primitive", "[inplace]") {
  Tensor x = leaf({1.f, 2.f}, {2}), w = leaf({3.f, 4.f}, {2});
  Tensor y = ops::mul(x, w);
  backend_for(w.device()).fill(w, 7.0);  // primitives do not know w is live
  w.mark_modified();
  REQUIRE_THROWS_WITH(y.backward(Tensor::ones({2})), Catch::Contains("'mul'") &&
                                                         Catch::Contains("clone()"));
}

TEST_CASE("retain_graph keeps the version records for a second backward", "[inplace]") {
  Tensor x = leaf(3.0), w = leaf(2.0);
  Tensor y = ops::mul(x, w);
  BackwardOptions retain;
  retain.retain_graph = true;
  y.backward(Tensor(), retain);
  y.backward(Tensor(), retain);  // nothing was modified: the second pass runs
  CHECK(x.grad().item() == Approx(4.0));
  CHECK(w.grad().item() == Approx(6.0));

  w.fill_(1.0);
  REQUIRE_THROWS_WITH(y.backward(), Catch::Contains("'mul'"));
}

TEST_CASE("the saved versions are released with the saved tensors", "[inplace]") {
  Tensor x = leaf(3.0), w = leaf(2.0);
  Tensor y = ops::mul(x, w);
  const std::shared_ptr<Node> node = y.grad_fn();
  REQUIRE(node);
  CHECK(node->saved_versions.size() == 2);
  y.backward();
  CHECK(node->saved_versions.empty());
}

TEST_CASE("in-place .grad accumulation and batch_norm running statistics bump the version",
          "[inplace]") {
  SECTION("a .grad saved by an op, then accumulated into") {
    Tensor x = leaf(3.0), w = leaf(2.0);
    Tensor y = ops::mul(x, w);
    BackwardOptions retain;
    retain.retain_graph = true;
    y.backward(Tensor(), retain);
    Tensor v = leaf(4.0);
    Tensor z = ops::mul(v, x.grad());
    y.backward();  // accumulates into x.grad in place
    CHECK(x.grad().item() == Approx(4.0));
    REQUIRE_THROWS_WITH(z.backward(), Catch::Contains("'mul'"));
  }
  SECTION("a running statistic saved by an op, then updated by batch_norm2d") {
    Tensor running_mean = Tensor::zeros({2});
    Tensor running_var = Tensor::ones({2});
    Tensor s = leaf({1.f, 1.f}, {2});
    Tensor z = ops::mul(s, running_mean);
    Tensor x = Tensor::from_vector({1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f, 8.f}, {2, 2, 1, 2});
    Tensor gamma = Tensor::ones({2}), beta = Tensor::zeros({2});
    ops::batch_norm2d(x, gamma, beta, running_mean, running_var, /*training=*/true, 0.1, 1e-5);
    REQUIRE_THROWS_WITH(z.backward(Tensor::ones({2})), Catch::Contains("'mul'"));
  }
}
