// SGD against a double-precision reimplementation of torch.optim.SGD's documented algorithm:
//   g = grad + weight_decay * p
//   buf = g on the first step, else momentum * buf + (1 - dampening) * g   (momentum != 0)
//   g = g + momentum * buf if nesterov, else buf                            (momentum != 0)
//   p = p - lr * g
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/half.h"
#include "core/tensor.h"
#include "layers/parameter.h"
#include "optim/sgd.h"
#include "tests/optim/optim_test_util.h"

using namespace mixprec;

using namespace mixprec_test;

namespace {

struct Reference {
  SgdOptions o;
  std::vector<double> p, buf;
  bool started = false;

  void step(const std::vector<double>& grad) {
    for (size_t i = 0; i < p.size(); ++i) {
      double g = grad[i] + o.weight_decay * p[i];
      if (o.momentum != 0.0) {
        buf[i] = started ? o.momentum * buf[i] + (1.0 - o.dampening) * g : g;
        g = o.nesterov ? g + o.momentum * buf[i] : buf[i];
      }
      p[i] -= o.lr * g;
    }
    started = true;
  }
};

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

}  // namespace

TEST_CASE("SGD follows torch.optim.SGD's algorithm over several steps", "[sgd]") {
  struct Config {
    const char* label;
    SgdOptions options;
  };
  const Config configs[] = {
      {"plain", {0.1, 0.0, 0.0, 0.0, false}},
      {"momentum", {0.05, 0.9, 0.0, 0.0, false}},
      {"dampening", {0.05, 0.9, 0.3, 0.0, false}},
      {"nesterov", {0.05, 0.8, 0.0, 0.0, true}},
      {"weight decay", {0.1, 0.0, 0.0, 0.02, false}},
      {"all", {0.02, 0.7, 0.0, 0.1, true}},
  };
  constexpr size_t kN = 300;
  constexpr int kSteps = 5;
  for (DType working : {DType::F32, DType::F16, DType::BF16}) {
    for (const Config& c : configs) {
      CAPTURE(working, c.label);
      const std::vector<float> init = random_values(kN, 1, 1.0f);
      Parameter p("w", Tensor::from_vector(init, {15, 20}));
      p.set_working_dtype(working);
      SGD sgd({p}, c.options);
      Reference ref{c.options, widen(init), std::vector<double>(kN, 0.0)};
      CHECK(!sgd.momentum_buffer(0).defined());

      for (int step = 0; step < kSteps; ++step) {
        const std::vector<float> g = random_values(kN, 100 + step, 0.5f);
        p.working().set_grad(Tensor::from_vector(g, {15, 20}));
        sgd.step();
        ref.step(widen(g));
        // Refreshed in the same step, not later.
        if (working != DType::F32) CHECK(working_matches_master(p));
      }
      const std::vector<float> got = p.master().to_float_vector();
      for (size_t i = 0; i < kN; ++i) {
        CAPTURE(i);
        REQUIRE(got[i] == Approx(ref.p[i]).epsilon(1e-5).margin(1e-6));
      }
      if (c.options.momentum != 0.0) {
        const Tensor buf = sgd.momentum_buffer(0);
        REQUIRE(buf.defined());
        CHECK(buf.dtype() == DType::F32);
        const std::vector<float> b = buf.to_float_vector();
        for (size_t i = 0; i < kN; ++i)
          REQUIRE(b[i] == Approx(ref.buf[i]).epsilon(1e-5).margin(1e-6));
      } else {
        CHECK(!sgd.momentum_buffer(0).defined());
      }
      CHECK(sgd.steps_taken() == kSteps);
    }
  }
}

TEST_CASE("SGD leaves parameters without a gradient or frozen untouched", "[sgd]") {
  Parameter a("a", Tensor::from_vector({1.f, 2.f}, {2}));
  Parameter b("b", Tensor::from_vector({3.f, 4.f}, {2}));
  Parameter c("c", Tensor::from_vector({5.f, 6.f}, {2}));
  c.set_working_dtype(DType::F16);
  SGD sgd({a, b, c}, {0.5, 0.9});
  CHECK(sgd.name() == "sgd");
  CHECK(sgd.params().size() == 3);
  CHECK(sgd.steps_taken() == 0);

  a.working().set_grad(Tensor::from_vector({1.f, -1.f}, {2}));
  c.working().set_grad(Tensor::from_vector({1.f, 1.f}, {2}));
  c.set_requires_grad(false);
  const auto b0 = raw_bytes(b.master()), c0 = raw_bytes(c.master()), cw0 = raw_bytes(c.working());
  sgd.step();
  CHECK(a.master().to_float_vector() == std::vector<float>{0.5f, 2.5f});
  CHECK(raw_bytes(b.master()) == b0);
  CHECK(raw_bytes(c.master()) == c0);
  CHECK(raw_bytes(c.working()) == cw0);
  CHECK(!sgd.momentum_buffer(1).defined());
  CHECK(!sgd.momentum_buffer(2).defined());
  CHECK(sgd.steps_taken() == 1);

  // Dropping the gradients leaves every parameter alone; the step still counts.
  sgd.zero_grad();
  CHECK(!a.grad().defined());
  const auto a1 = raw_bytes(a.master());
  sgd.step();
  CHECK(raw_bytes(a.master()) == a1);
  CHECK(sgd.steps_taken() == 2);

  // A new learning rate applies from the next step: buf = 0.9 * buf + g with buf = g = 1.
  a.working().set_grad(Tensor::from_vector({1.f, 1.f}, {2}));
  sgd.set_lr(0.25);
  CHECK(sgd.lr() == 0.25);
  sgd.step();
  const float expected0 = 0.5f - 0.25f * (0.9f * 1.f + 1.f);
  CHECK(a.master().get(0) == Approx(expected0).epsilon(1e-6));
}

TEST_CASE("SGD refuses gradients that still carry a loss scale", "[sgd]") {
  Parameter a("encoder.w", Tensor::from_vector({1.f, 2.f}, {2}));
  Parameter b("b", Tensor::from_vector({3.f}, {1}));
  SGD sgd({b, a});
  b.working().set_grad(Tensor::from_vector({1.f}, {1}));
  a.working().set_grad(Tensor::from_vector({1024.f, 1024.f}, {2}));
  a.working().set_grad_scale(1024.0);
  const auto a0 = raw_bytes(a.master()), b0 = raw_bytes(b.master());
  CHECK_THROWS_WITH(sgd.step(), Catch::Contains("'encoder.w'") && Catch::Contains("1024") &&
                                    Catch::Contains("scaler"));
  // Nothing was updated, the parameter before it included.
  CHECK(raw_bytes(a.master()) == a0);
  CHECK(raw_bytes(b.master()) == b0);
  CHECK(sgd.steps_taken() == 0);
}

TEST_CASE("SGD and the optimizer base reject invalid options", "[sgd]") {
  Parameter p("w", Tensor::ones({2}));
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  auto make = [&](SgdOptions o) { SGD sgd({p}, o); };
  CHECK_THROWS_WITH(make({-0.1}), Catch::Contains("lr"));
  CHECK_THROWS_WITH(make({nan}), Catch::Contains("lr"));
  CHECK_THROWS_WITH(make({inf}), Catch::Contains("lr"));
  CHECK_THROWS_WITH(make({0.1, -0.5}), Catch::Contains("momentum"));
  CHECK_THROWS_WITH(make({0.1, nan}), Catch::Contains("momentum"));
  CHECK_THROWS_WITH(make({0.1, 0.9, inf}), Catch::Contains("dampening"));
  CHECK_THROWS_WITH(make({0.1, 0.9, 0.0, -1e-4}), Catch::Contains("weight_decay"));
  CHECK_THROWS_WITH(make({0.1, 0.9, 0.0, nan}), Catch::Contains("weight_decay"));
  CHECK_THROWS_WITH(make({0.1, 0.0, 0.0, 0.0, true}), Catch::Contains("nesterov"));
  CHECK_THROWS_WITH(make({0.1, 0.9, 0.1, 0.0, true}), Catch::Contains("nesterov"));
  CHECK_NOTHROW(make({0.0, 0.9, 0.0, 0.0, true}));

  CHECK_THROWS_WITH(SGD({}, {}), Catch::Contains("empty"));
  CHECK_THROWS_WITH(SGD({p, Parameter()}, {}), Catch::Contains("undefined"));
  CHECK_THROWS_WITH(SGD({p, p}, {}, "head"), Catch::Contains("'w'") && Catch::Contains("twice") &&
                                                 Catch::Contains("'head'"));

  SGD sgd({p});
  CHECK_THROWS_WITH(sgd.set_lr(-1.0), Catch::Contains("learning rate"));
  CHECK_THROWS(sgd.set_lr(nan));
  CHECK_THROWS_WITH(sgd.set_lr(1e39), Catch::Contains("FP32"));  // inf as an FP32 rate
  CHECK(sgd.lr() == 0.01);
}
