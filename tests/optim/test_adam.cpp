// Adam and AdamW against a double-precision reimplementation of torch.optim.Adam / AdamW's
// documented algorithm (amsgrad off, maximize off), with a per-parameter step count t:
//   Adam:  g = grad + weight_decay * p          AdamW: p = p * (1 - lr * weight_decay)
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g^2
//   m_hat = m / (1 - beta1^t),  v_hat = v / (1 - beta2^t)
//   p = p - lr * m_hat / (sqrt(v_hat) + eps)
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "core/half.h"
#include "core/tensor.h"
#include "layers/parameter.h"
#include "optim/adam.h"
#include "tests/optim/optim_test_util.h"

using namespace mixprec;

using namespace mixprec_test;

namespace {

struct AdamReference {
  double lr, beta1, beta2, eps, weight_decay;
  bool decoupled;
  std::vector<double> p, m, v;
  int64_t t = 0;

  AdamReference(const AdamOptions& o, bool decoupled_decay, double decay,
                const std::vector<float>& init)
      : lr(o.lr), beta1(o.beta1), beta2(o.beta2), eps(o.eps), weight_decay(decay),
        decoupled(decoupled_decay), p(init.begin(), init.end()), m(init.size(), 0.0),
        v(init.size(), 0.0) {}

  void step(const std::vector<float>& grad) {
    ++t;
    const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(t));
    const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(t));
    for (size_t i = 0; i < p.size(); ++i) {
      double g = grad[i];
      if (decoupled) p[i] *= 1.0 - lr * weight_decay;
      else g += weight_decay * p[i];
      m[i] = beta1 * m[i] + (1.0 - beta1) * g;
      v[i] = beta2 * v[i] + (1.0 - beta2) * g * g;
      const double m_hat = m[i] / bc1, v_hat = v[i] / bc2;
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
};

void require_close(const std::vector<float>& got, const std::vector<double>& expected) {
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    REQUIRE(got[i] == Approx(expected[i]).epsilon(1e-5).margin(1e-6));
  }
}

}  // namespace

TEST_CASE("Adam and AdamW follow torch's algorithm with per-parameter step counts", "[adam]") {
  struct Config {
    const char* label;
    bool decoupled;
    AdamOptions options;
  };
  const Config configs[] = {
      {"adam", false, {0.01, 0.9, 0.999, 1e-8, 0.0, {}}},
      {"adam + weight decay", false, {0.01, 0.9, 0.999, 1e-8, 0.1, {}}},
      {"adamw + weight decay", true, {0.01, 0.9, 0.999, 1e-8, 0.1, {}}},
      {"adamw, other betas", true, {0.003, 0.8, 0.95, 1e-6, 0.5, {}}},
  };
  constexpr size_t kW = 60, kB = 10;
  constexpr int kSteps = 5;
  constexpr int kBiasSkipped = 2;  // the step in which the bias has no gradient
  for (DType working : {DType::F32, DType::F16, DType::BF16}) {
    for (const Config& c : configs) {
      CAPTURE(working, c.label);
      const std::vector<float> w0 = random_values(kW, 1, 1.0f), b0 = random_values(kB, 2, 1.0f);
      Parameter w("w", Tensor::from_vector(w0, {6, 10}));
      Parameter b("b", Tensor::from_vector(b0, {kB}));
      w.set_working_dtype(working);
      b.set_working_dtype(working);
      const std::vector<Parameter> params = {w, b};
      std::unique_ptr<Adam> opt = c.decoupled ? std::make_unique<AdamW>(params, c.options)
                                              : std::make_unique<Adam>(params, c.options);
      CHECK(opt->decoupled() == c.decoupled);
      CHECK(opt->lr() == c.options.lr);
      // Default filters: Adam decays everything, AdamW only the matrix.
      AdamReference ref_w(c.options, c.decoupled, c.options.weight_decay, w0);
      AdamReference ref_b(c.options, c.decoupled, c.decoupled ? 0.0 : c.options.weight_decay, b0);
      CHECK(!opt->exp_avg(0).defined());
      CHECK(!opt->exp_avg_sq(1).defined());

      for (int step = 0; step < kSteps; ++step) {
        const std::vector<float> gw = random_values(kW, 100 + step, 0.5f);
        const std::vector<float> gb = random_values(kB, 200 + step, 0.5f);
        w.working().set_grad(Tensor::from_vector(gw, {6, 10}));
        ref_w.step(gw);
        if (step == kBiasSkipped) {
          b.zero_grad();
        } else {
          b.working().set_grad(Tensor::from_vector(gb, {kB}));
          ref_b.step(gb);
        }
        opt->step();
        // Refreshed in the same step, not later.
        if (working != DType::F32) {
          CHECK(working_matches_master(w));
          CHECK(working_matches_master(b));
        }
      }
      CHECK(opt->steps_taken() == kSteps);
      CHECK(opt->param_steps(0) == kSteps);
      CHECK(opt->param_steps(1) == kSteps - 1);
      require_close(w.master().to_float_vector(), ref_w.p);
      require_close(b.master().to_float_vector(), ref_b.p);
      for (size_t i = 0; i < 2; ++i) {
        const AdamReference& ref = i == 0 ? ref_w : ref_b;
        REQUIRE(opt->exp_avg(i).dtype() == DType::F32);
        REQUIRE(opt->exp_avg_sq(i).dtype() == DType::F32);
        require_close(opt->exp_avg(i).to_float_vector(), ref.m);
        require_close(opt->exp_avg_sq(i).to_float_vector(), ref.v);
      }
    }
  }
}

TEST_CASE("AdamW decays matrices only by default, Adam every parameter", "[adam]") {
  // With zero gradients and zero moments the Adam term is exactly 0 / (0 + eps) = 0, so an
  // AdamW step only shrinks the decayed parameters.
  const std::vector<float> m0 = {1.5f, -2.0f, 0.25f, 3.0f, -0.75f, 0.5f};
  const std::vector<float> v0 = {0.5f, -1.25f, 2.0f};
  const double lr = 0.1, wd = 0.2;
  AdamOptions o;
  o.lr = lr;
  o.weight_decay = wd;

  auto run = [&](bool decoupled, const AdamOptions& options, Parameter& mat, Parameter& vec) {
    mat = Parameter("fc.weight", Tensor::from_vector(m0, {2, 3}));
    vec = Parameter("fc.bias", Tensor::from_vector(v0, {3}));
    std::unique_ptr<Adam> opt = decoupled ? std::make_unique<AdamW>(std::vector{mat, vec}, options)
                                          : std::make_unique<Adam>(std::vector{mat, vec}, options);
    mat.working().set_grad(Tensor::zeros({2, 3}));
    vec.working().set_grad(Tensor::zeros({3}));
    opt->step();
  };

  CHECK(decay_matrices_only(Parameter("w", Tensor::zeros({2, 3}))));
  CHECK(decay_matrices_only(Parameter("k", Tensor::zeros({2, 3, 3, 3}))));
  CHECK(!decay_matrices_only(Parameter("b", Tensor::zeros({3}))));

  SECTION("AdamW, default filter") {
    Parameter mat, vec;
    run(true, o, mat, vec);
    const std::vector<float> got = mat.master().to_float_vector();
    for (size_t i = 0; i < m0.size(); ++i) {
      CHECK(got[i] == Approx(m0[i] * (1.0 - lr * wd)).epsilon(1e-6));
    }
    CHECK(vec.master().to_float_vector() == v0);
  }
  SECTION("AdamW, custom filter") {
    AdamOptions custom = o;
    custom.decay_filter = [](const Parameter& p) { return p.name() == "fc.bias"; };
    Parameter mat, vec;
    run(true, custom, mat, vec);
    CHECK(mat.master().to_float_vector() == m0);
    const std::vector<float> got = vec.master().to_float_vector();
    for (size_t i = 0; i < v0.size(); ++i) {
      CHECK(got[i] == Approx(v0[i] * (1.0 - lr * wd)).epsilon(1e-6));
    }
  }
  SECTION("Adam, default filter: the L2 term reaches the bias too") {
    Parameter mat, vec;
    run(false, o, mat, vec);
    AdamReference ref(o, false, wd, v0);
    ref.step(std::vector<float>(v0.size(), 0.0f));
    // g = wd * p, so the first step moves each element by about lr against its sign.
    require_close(vec.master().to_float_vector(), ref.p);
    CHECK(vec.master().get(0) == Approx(0.5 - lr).margin(1e-6));
  }
  SECTION("Adam, a parameter excluded by the filter gets no weight decay") {
    AdamOptions custom = o;
    custom.decay_filter = decay_matrices_only;
    Parameter mat, vec;
    run(false, custom, mat, vec);
    CHECK(vec.master().to_float_vector() == v0);  // zero gradient, no decay: no change
    CHECK(mat.master().get(0) == Approx(1.5 - lr).margin(1e-6));
  }
}

TEST_CASE("Adam skips frozen parameters and those without a gradient", "[adam]") {
  Parameter a("a", Tensor::from_vector({1.f, 2.f}, {2}));
  Parameter b("b", Tensor::from_vector({3.f, 4.f}, {2}));
  b.set_working_dtype(DType::F16);
  AdamOptions o;
  o.lr = 0.1;
  Adam adam({a, b}, o);
  CHECK(adam.name() == "adam");
  CHECK(std::string(adam.type_name()) == "adam");
  CHECK(std::string(AdamW({a}).type_name()) == "adamw");
  CHECK(AdamW({a}).name() == "adamw");

  b.working().set_grad(Tensor::from_vector({1.f, 1.f}, {2}));
  b.set_requires_grad(false);
  const auto b0 = raw_bytes(b.master()), bw0 = raw_bytes(b.working());
  a.working().set_grad(Tensor::from_vector({2.f, -0.5f}, {2}));
  adam.step();
  // First step: m_hat = g, v_hat = g^2, so each element moves by lr * g / (|g| + eps).
  CHECK(a.master().get(0) == Approx(1.0 - 0.1).epsilon(1e-6));
  CHECK(a.master().get(1) == Approx(2.0 + 0.1).epsilon(1e-6));
  CHECK(raw_bytes(b.master()) == b0);
  CHECK(raw_bytes(b.working()) == bw0);
  CHECK(!adam.exp_avg(1).defined());
  CHECK(adam.param_steps(0) == 1);
  CHECK(adam.param_steps(1) == 0);
  CHECK(adam.steps_taken() == 1);
}

TEST_CASE("Adam and AdamW reject invalid options", "[adam]") {
  Parameter p("w", Tensor::ones({2}));
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  auto adam = [&](AdamOptions o) { Adam opt({p}, o, "enc"); };
  auto adamw = [&](AdamOptions o) { AdamW opt({p}, o); };
  auto with = [](auto change) {
    AdamOptions o;
    change(o);
    return o;
  };
  using Catch::Contains;
  CHECK_THROWS_WITH(adam(with([](AdamOptions& o) { o.lr = -1e-3; })),
                    Contains("Adam 'enc'") && Contains("lr") && Contains("-0.001"));
  CHECK_THROWS_WITH(adam(with([&](AdamOptions& o) { o.lr = nan; })), Contains("lr"));
  CHECK_THROWS_WITH(adam(with([&](AdamOptions& o) { o.lr = inf; })), Contains("lr"));
  CHECK_THROWS_WITH(adam(with([](AdamOptions& o) { o.beta1 = 1.0; })),
                    Contains("beta1") && Contains("[0, 1)"));
  CHECK_THROWS_WITH(adam(with([](AdamOptions& o) { o.beta1 = -0.1; })), Contains("beta1"));
  CHECK_THROWS_WITH(adam(with([](AdamOptions& o) { o.beta2 = 1.5; })), Contains("beta2"));
  // Below 1 in double, 1 in FP32: the bias correction would divide by zero.
  CHECK_THROWS_WITH(adam(with([](AdamOptions& o) { o.beta2 = 1.0 - 1e-10; })),
                    Contains("beta2") && Contains("FP32"));
  CHECK_THROWS_WITH(adam(with([&](AdamOptions& o) { o.beta2 = nan; })), Contains("beta2"));
  CHECK_THROWS_WITH(adam(with([](AdamOptions& o) { o.eps = 0.0; })), Contains("eps"));
  CHECK_THROWS_WITH(adam(with([](AdamOptions& o) { o.eps = -1e-8; })), Contains("eps"));
  CHECK_THROWS_WITH(adam(with([](AdamOptions& o) { o.eps = 1e-60; })), Contains("eps"));
  CHECK_THROWS_WITH(adam(with([](AdamOptions& o) { o.weight_decay = -0.01; })),
                    Contains("weight_decay"));
  CHECK_THROWS_WITH(adamw(with([&](AdamOptions& o) { o.weight_decay = inf; })),
                    Contains("AdamW 'adamw'") && Contains("weight_decay"));
  CHECK_NOTHROW(adam(with([](AdamOptions& o) {
    o.lr = 0.0;
    o.beta1 = 0.0;
    o.beta2 = 0.0;
  })));
  CHECK_THROWS_WITH(Adam({}, {}), Contains("empty"));
  CHECK_THROWS_WITH(AdamW({p, p}, {}), Contains("twice"));
}
