// clip_grad_norm: the global L2 norm of all gradients, and scaling by
// max_norm / (norm + 1e-6) when it exceeds max_norm (torch.nn.utils.clip_grad_norm_).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/tensor.h"
#include "layers/parameter.h"
#include "optim/clip_grad_norm.h"
#include "tests/optim/optim_test_util.h"

using namespace mixprec;

using namespace mixprec_test;

namespace {

Parameter with_grad(const char* name, const std::vector<float>& grad, DType working = DType::F32) {
  const int64_t n = static_cast<int64_t>(grad.size());
  Parameter p(name, Tensor::zeros({n}));
  p.set_working_dtype(working);
  p.working().set_grad(Tensor::from_vector(grad, {n}));
  return p;
}

}  // namespace

TEST_CASE("clip_grad_norm scales [3, 4] to max_norm 1", "[clip]") {
  Parameter p = with_grad("w", {3.f, 4.f});
  const Tensor g = p.grad();
  CHECK(clip_grad_norm({p}, 1.0) == 5.0);  // 9 + 16 = 25 is exact in FP32
  CHECK(p.grad().is_same(g));               // scaled in place
  const double coef = 1.0 / (5.0 + 1e-6);
  CHECK(g.get(0) == Approx(3.0 * coef).epsilon(1e-6));
  CHECK(g.get(1) == Approx(4.0 * coef).epsilon(1e-6));
  CHECK(g.get(0) == Approx(0.6).epsilon(1e-5));
  CHECK(g.get(1) == Approx(0.8).epsilon(1e-5));
}

TEST_CASE("clip_grad_norm leaves gradients under the limit bit for bit", "[clip]") {
  Parameter p = with_grad("w", {0.1f, -0.2f, 0.3f});
  const auto before = raw_bytes(p.grad());
  const double norm = clip_grad_norm({p}, 10.0);
  CHECK(norm == Approx(std::sqrt(0.01 + 0.04 + 0.09)).epsilon(1e-6));
  CHECK(raw_bytes(p.grad()) == before);
  // Exactly at the limit the factor max_norm / (norm + 1e-6) is below 1 by a hair: PyTorch
  // scales then too, and so do we, by that factor.
  Parameter q = with_grad("q", {3.f, 4.f});
  clip_grad_norm({q}, 5.0);
  CHECK(q.grad().get(0) == Approx(3.0 * 5.0 / (5.0 + 1e-6)).epsilon(1e-7));
}

TEST_CASE("clip_grad_norm uses the global norm over all parameters", "[clip]") {
  Parameter a = with_grad("a", {1.f, 2.f, 2.f});         // 9
  Parameter b = with_grad("b", {4.f}, DType::F16);        // 16, F32 buffer of an F16 working copy
  Parameter none("none", Tensor::ones({2}));              // no gradient: skipped
  const double norm = clip_grad_norm({a, none, b}, 2.5);
  CHECK(norm == 5.0);
  const double coef = 2.5 / (5.0 + 1e-6);
  CHECK(a.grad().get(2) == Approx(2.0 * coef).epsilon(1e-6));
  CHECK(b.grad().get(0) == Approx(4.0 * coef).epsilon(1e-6));
  CHECK(!none.grad().defined());

  // Larger gradients against a double reference.
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<Parameter> params;
  std::vector<std::vector<float>> grads;
  double sum = 0.0;
  for (int64_t n : {5000, 20000, 7}) {
    std::vector<float> g(static_cast<size_t>(n));
    for (float& v : g) {
      v = dist(rng);
      sum += static_cast<double>(v) * v;
    }
    grads.push_back(g);
    params.push_back(with_grad("p", g));
  }
  const double ref = std::sqrt(sum);
  CHECK(clip_grad_norm(params, 1.0) == Approx(ref).epsilon(1e-5));
  double clipped = 0.0;
  for (const Parameter& p : params)
    for (float v : p.grad().to_float_vector()) clipped += static_cast<double>(v) * v;
  CHECK(std::sqrt(clipped) == Approx(1.0).epsilon(1e-5));
  CHECK(params[1].grad().get(10) == Approx(grads[1][10] / (ref + 1e-6)).epsilon(1e-5));
}

TEST_CASE("clip_grad_norm returns a non-finite norm and scales nothing", "[clip]") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Parameter a = with_grad("a", {100.f, 200.f});
  Parameter b = with_grad("b", {1.f, inf});
  const auto a0 = raw_bytes(a.grad()), b0 = raw_bytes(b.grad());
  CHECK(std::isinf(clip_grad_norm({a, b}, 1.0)));
  CHECK(raw_bytes(a.grad()) == a0);
  CHECK(raw_bytes(b.grad()) == b0);
  CHECK_THROWS_WITH(clip_grad_norm({a, b}, 1.0, {false, true}), Catch::Contains("inf"));
  CHECK(raw_bytes(a.grad()) == a0);

  Parameter c = with_grad("c", {nan, 1.f});
  CHECK(std::isnan(clip_grad_norm({a, c}, 1.0)));
  CHECK(raw_bytes(a.grad()) == a0);
  CHECK_THROWS(clip_grad_norm({c}, 1.0, {false, true}));
}

TEST_CASE("clip_grad_norm refuses gradients that still carry a loss scale", "[clip]") {
  Parameter a = with_grad("a", {3.f, 4.f});
  Parameter b = with_grad("decoder.bias", {3072.f, 4096.f}, DType::F16);
  b.working().set_grad_scale(1024.0);
  const auto a0 = raw_bytes(a.grad()), b0 = raw_bytes(b.grad());
  CHECK_THROWS_WITH(clip_grad_norm({a, b}, 1.0),
                    Catch::Contains("'decoder.bias'") && Catch::Contains("1024") &&
                        Catch::Contains("call scaler.unscale(optimizer) before clip_grad_norm"));
  CHECK(raw_bytes(a.grad()) == a0);
  CHECK(raw_bytes(b.grad()) == b0);
  // Allowed on request: the norm is then the scaled one.
  ClipOptions allow;
  allow.allow_scaled = true;
  CHECK(clip_grad_norm({b}, 1e9, allow) == 5120.0);
}

TEST_CASE("clip_grad_norm rejects a max_norm that is not positive and finite", "[clip]") {
  Parameter p = with_grad("w", {3.f, 4.f});
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN(),
                     std::numeric_limits<double>::infinity()}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH(clip_grad_norm({p}, bad), Catch::Contains("max_norm"));
  }
  CHECK(p.grad().to_float_vector() == std::vector<float>{3.f, 4.f});
  CHECK(clip_grad_norm({Parameter("no_grad", Tensor::ones({1}))}, 1.0) == 0.0);
}
