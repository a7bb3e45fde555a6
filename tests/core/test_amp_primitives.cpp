// The mixed-precision primitives of the CPU backend: unscale_and_check, squared_norms,
// sgd_step, adam_step and update_loss_scale. Expected values come from double-precision
// references and from a rounding reference that picks the nearest representable value by
// comparing neighbours in double, independently of the conversion code under test.
#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/backend.h"
#include "core/half.h"
#include "core/math/amp.h"
#include "core/tensor.h"
#include "tests/core/cpu_test_util.h"
#include "tests/param_step_calls.h"
#include "tests/tensor_bytes.h"

using namespace mixprec;
using mixprec::testing::cpu_backend;
using mixprec::testing::kInf;
using mixprec::testing::normal_tensor;
using mixprec_test::raw_bytes;

namespace {

using mixprec_test::adam_step_deferred_on;
using mixprec_test::adam_step_on;
using mixprec_test::sgd_step_deferred_on;
using mixprec_test::sgd_step_on;

uint16_t bits16(const Tensor& t, int64_t i) {
  uint16_t b;
  std::memcpy(&b, static_cast<const uint8_t*>(t.data()) + 2 * i, sizeof b);
  return b;
}

double value_of_bits(DType dtype, uint32_t bits) {
  return dtype == DType::F16 ? half_bits_to_float(static_cast<uint16_t>(bits))
                             : bf16_bits_to_float(static_cast<uint16_t>(bits));
}

// The F16/BF16 value nearest to `d` (ties to the even pattern), found by comparing the
// candidate that truncation gives with its neighbours in double arithmetic. Only for finite
// values well inside the format's range.
double nearest_16(DType dtype, double d) {
  // A starting pattern at most one step from the answer: float(d) converted to 16 bits (two
  // roundings can be off by one step, never more).
  const uint32_t start = dtype == DType::F16 ? float_to_half_bits(static_cast<float>(d))
                                             : float_to_bf16_bits(static_cast<float>(d));
  double best = value_of_bits(dtype, start);
  uint32_t best_bits = start;
  for (int delta = -2; delta <= 2; ++delta) {
    const uint32_t candidate = static_cast<uint32_t>(static_cast<int32_t>(start) + delta);
    if ((candidate & 0x8000u) != (start & 0x8000u)) continue;  // stay on d's side of zero
    const double v = value_of_bits(dtype, candidate);
    if (!std::isfinite(v)) continue;
    const double err = std::fabs(v - d), best_err = std::fabs(best - d);
    if (err < best_err || (err == best_err && (candidate & 1u) == 0 && (best_bits & 1u) != 0)) {
      best = v;
      best_bits = candidate;
    }
  }
  return best;
}

// `d` rounded once to `dtype`.
double round_once(DType dtype, double d) {
  if (dtype == DType::F32) return static_cast<double>(static_cast<float>(d));
  if (d == 0.0) return d;
  return nearest_16(dtype, d);
}

struct Flags {
  Tensor found_inf = Tensor::zeros({1});
  Tensor tensor_flags;
  explicit Flags(size_t n) : tensor_flags(Tensor::zeros({static_cast<int64_t>(n)}, DType::I32)) {}
};

}  // namespace

TEST_CASE("unscale_and_check restores power-of-two-scaled gradients exactly", "[amp_primitives]") {
  struct Case {
    DType dtype;
    double inv_scale;
    double stddev;  // of the scaled values, inside the format's range
  };
  // 40000 elements: the parallel path is taken as well.
  for (const Case& c : {Case{DType::F32, 0x1p-16, 1e4}, Case{DType::F16, 0x1p-10, 1e3},
                        Case{DType::BF16, 0x1p-16, 1e4}}) {
    CAPTURE(c.dtype);
    Tensor g = normal_tensor(40000, c.dtype, 7, c.stddev);
    // Keep the unscaled values normal in every format (no subnormal rounding).
    for (int64_t i = 0; i < g.numel(); ++i)
      if (std::fabs(g.get(i)) < 0.0625) g.set(i, 0.0625);
    const std::vector<float> before = g.to_float_vector();
    Flags f(1);
    cpu_backend().unscale_and_check({g}, c.inv_scale, f.found_inf, f.tensor_flags);
    const std::vector<float> after = g.to_float_vector();
    int64_t wrong = 0;
    for (size_t i = 0; i < before.size(); ++i)
      wrong += static_cast<double>(after[i]) == static_cast<double>(before[i]) * c.inv_scale
                   ? 0
                   : 1;
    CHECK(wrong == 0);
    CHECK(f.tensor_flags.get(0) == 0.0);
    CHECK(f.found_inf.item() == 0.0);
  }
}

TEST_CASE("unscale_and_check rounds the double product once for any scale", "[amp_primitives]") {
  const double inv_scale = 1.0 / 3000.0;
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    CAPTURE(dtype);
    Tensor g = normal_tensor(5000, dtype, 11, dtype == DType::F16 ? 2000.0 : 1e5);
    const std::vector<float> before = g.to_float_vector();
    Flags f(1);
    cpu_backend().unscale_and_check({g}, inv_scale, f.found_inf, f.tensor_flags);
    int64_t wrong = 0;
    for (size_t i = 0; i < before.size(); ++i) {
      const double expected = round_once(dtype, static_cast<double>(before[i]) * inv_scale);
      wrong += g.get(static_cast<int64_t>(i)) == expected ? 0 : 1;
    }
    CHECK(wrong == 0);
  }

  // Products just above a 16-bit midpoint, by less than half an FP32 step: rounding to float
  // first would land on the midpoint and then round down to even. One rounding goes up.
  SECTION("F16") {
    Tensor g = Tensor::from_vector({1.0f, -1.0f}, {2}, DType::F16);
    Flags f(1);
    cpu_backend().unscale_and_check({g}, 1.0 + 0x1p-11 + 0x1p-40, f.found_inf, f.tensor_flags);
    CHECK(g.get(0) == 1.0 + 0x1p-10);
    CHECK(g.get(1) == -(1.0 + 0x1p-10));
  }
  SECTION("BF16") {
    Tensor g = Tensor::from_vector({1.0f, -1.0f}, {2}, DType::BF16);
    Flags f(1);
    cpu_backend().unscale_and_check({g}, 1.0 + 0x1p-8 + 0x1p-40, f.found_inf, f.tensor_flags);
    CHECK(g.get(0) == 1.0 + 0x1p-7);
    CHECK(g.get(1) == -(1.0 + 0x1p-7));
  }
}

TEST_CASE("unscale_and_check flags exactly the tensors holding Inf, -Inf or NaN",
          "[amp_primitives]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (double bad : {kInf, -kInf, nan}) {
    for (size_t where = 0; where < 3; ++where) {
      CAPTURE(bad, where);
      std::vector<Tensor> grads = {
          Tensor::from_vector({2.f, 4.f, 6.f}, {3}, DType::F32),
          Tensor::from_vector({8.f, -8.f}, {2}, DType::F16),
          Tensor::from_vector({16.f, 32.f, 64.f, 1.f}, {2, 2}, DType::BF16)};
      grads[where].set(1, bad);
      Flags f(3);
      cpu_backend().unscale_and_check(grads, 0.5, f.found_inf, f.tensor_flags);
      for (size_t i = 0; i < 3; ++i)
        CHECK(f.tensor_flags.get(static_cast<int64_t>(i)) == (i == where ? 1.0 : 0.0));
      CHECK(f.found_inf.item() == 1.0);
      // The finite values were still unscaled (the whole pass runs; the step is skipped later).
      CHECK(grads[where].get(0) == std::vector<double>{1.0, 4.0, 8.0}[where]);

      // A later call with finite data clears the per-tensor flags but never found_inf.
      std::vector<Tensor> finite = {Tensor::from_vector({2.f}, {1}),
                                    Tensor::from_vector({4.f}, {1}),
                                    Tensor::from_vector({8.f}, {1}, DType::F16)};
      cpu_backend().unscale_and_check(finite, 0.5, f.found_inf, f.tensor_flags);
      for (int64_t i = 0; i < 3; ++i) CHECK(f.tensor_flags.get(i) == 0.0);
      CHECK(f.found_inf.item() == 1.0);
      CHECK(finite[2].get(0) == 4.0);
    }
  }

  // Finite data leaves a clear found_inf clear.
  Tensor g = Tensor::from_vector({65504.f, -1e-3f}, {2}, DType::F16);
  Flags f(1);
  cpu_backend().unscale_and_check({g}, 1.0, f.found_inf, f.tensor_flags);
  CHECK(f.found_inf.item() == 0.0);
  CHECK(f.tensor_flags.get(0) == 0.0);
}

// The bit test of 16-bit elements against the float test of their widened values, for every
// bit pattern; and the CPU's all_finite, which runs on it, on each kind of non-finite value.
TEST_CASE("is_finite_element of every F16 and BF16 bit pattern is the widened value's test",
          "[amp_primitives]") {
  int64_t differ = 0, finite16 = 0, finite_bf16 = 0;
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const half h = half::from_bits(static_cast<uint16_t>(bits));
    const bfloat16 b = bfloat16::from_bits(static_cast<uint16_t>(bits));
    differ += is_finite_element(h) != is_finite_value(to_float(h));
    differ += is_finite_element(b) != is_finite_value(to_float(b));
    finite16 += is_finite_element(h);
    finite_bf16 += is_finite_element(b);
  }
  CHECK(differ == 0);
  // All but the 2 * 2^10 patterns with an all-ones exponent; 2 * 2^7 for BF16.
  CHECK(finite16 == 65536 - 2048);
  CHECK(finite_bf16 == 65536 - 256);
  for (const DType dtype : {DType::F16, DType::BF16}) {
    for (const double bad : {kInf, -kInf, std::numeric_limits<double>::quiet_NaN()}) {
      CAPTURE(dtype, bad);
      Tensor x = Tensor::from_vector(std::vector<float>(37, 1.5f), {37}, dtype);
      CHECK(cpu_backend().all_finite(x));
      x.set(33, bad);
      CHECK_FALSE(cpu_backend().all_finite(x));
    }
  }
}

TEST_CASE("unscale_and_check with inv_scale 1 only checks and leaves every bit as it was",
          "[amp_primitives]") {
  Tensor f32 = Tensor::from_vector({1.f, -0.f, 0x1p-140f, 3.5f}, {4});
  Tensor f16 = Tensor::from_vector({0x1p-24f, -0.f, 1.f, 2.f}, {4}, DType::F16);
  Tensor bf16 = Tensor::from_vector({1.f, 0x1p-130f, -3.f}, {3}, DType::BF16);
  // A signalling F16 NaN with a payload: any load-and-store through float would quiet it.
  const uint16_t snan = 0x7C01;
  std::memcpy(static_cast<uint8_t*>(f16.data()) + 6, &snan, sizeof snan);
  const auto b32 = raw_bytes(f32), b16 = raw_bytes(f16), bb16 = raw_bytes(bf16);
  Flags f(3);
  cpu_backend().unscale_and_check({f32, f16, bf16}, 1.0, f.found_inf, f.tensor_flags);
  CHECK(raw_bytes(f32) == b32);
  CHECK(raw_bytes(f16) == b16);
  CHECK(raw_bytes(bf16) == bb16);
  CHECK(bits16(f16, 3) == snan);
  CHECK(f.tensor_flags.to_int_vector() == std::vector<int32_t>{0, 1, 0});
  CHECK(f.found_inf.item() == 1.0);
}

TEST_CASE("unscale_and_check rejects bad arguments naming the primitive", "[amp_primitives]") {
  Tensor g = Tensor::ones({3});
  Flags f(1);
  auto named = Catch::Contains("unscale_and_check");
  CHECK_THROWS_WITH(cpu_backend().unscale_and_check({Tensor::from_ints({1}, {1})}, 0.5, f.found_inf,
                                                    f.tensor_flags),
                    named && Catch::Contains("I32"));
  Tensor two_flags = Tensor::zeros({2}, DType::I32);
  CHECK_THROWS_WITH(cpu_backend().unscale_and_check({g}, 0.5, f.found_inf, two_flags), named);
  Tensor float_flags = Tensor::zeros({1});
  CHECK_THROWS_WITH(cpu_backend().unscale_and_check({g}, 0.5, f.found_inf, float_flags), named);
  Tensor half_found = Tensor::zeros({1}, DType::F16);
  CHECK_THROWS_WITH(cpu_backend().unscale_and_check({g}, 0.5, half_found, f.tensor_flags), named);
  CHECK_THROWS_WITH(cpu_backend().unscale_and_check({g}, 0.0, f.found_inf, f.tensor_flags), named);
  CHECK_THROWS_WITH(cpu_backend().unscale_and_check({Tensor()}, 0.5, f.found_inf, f.tensor_flags),
                    named);
  CHECK(g.to_float_vector() == std::vector<float>{1.f, 1.f, 1.f});
}

TEST_CASE("squared_norms matches a double reference and not the thread count",
          "[amp_primitives]") {
  std::vector<Tensor> xs = {normal_tensor(100003, DType::F32, 1, 1.0),
                            normal_tensor(1, DType::F16, 2, 3.0),
                            Tensor::empty({0}),
                            normal_tensor(20000, DType::BF16, 3, 0.01),
                            normal_tensor(777, DType::F16, 4, 10.0)};
  std::vector<double> expected;
  for (const Tensor& x : xs) {
    double s = 0.0;
    for (float v : x.to_float_vector()) s += static_cast<double>(v) * v;
    expected.push_back(s);
  }

  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  Tensor one = Tensor::empty({5});
  cpu_backend().squared_norms(xs, one);
  omp_set_num_threads(2);
  Tensor two = Tensor::full({5}, 123.0);
  cpu_backend().squared_norms(xs, two);
  omp_set_num_threads(threads);

  CHECK(raw_bytes(one) == raw_bytes(two));
  for (int64_t i = 0; i < 5; ++i) {
    CAPTURE(i);
    CHECK(one.get(i) == Approx(expected[static_cast<size_t>(i)]).epsilon(1e-5));
  }
  CHECK(one.get(2) == 0.0);

  Tensor wrong = Tensor::empty({4});
  CHECK_THROWS_WITH(cpu_backend().squared_norms(xs, wrong), Catch::Contains("squared_norms"));
  Tensor ids = Tensor::from_ints({1}, {1});
  Tensor out1 = Tensor::empty({1});
  CHECK_THROWS_WITH(cpu_backend().squared_norms({ids}, out1), Catch::Contains("squared_norms"));
}

namespace {

struct SgdStepTensors {
  Tensor master, grad, momentum, working;
};

SgdStepTensors make_sgd_state(int64_t n, DType working_dtype) {
  SgdStepTensors s;
  s.master = normal_tensor(n, DType::F32, 21, 1.0);
  s.grad = normal_tensor(n, DType::F32, 22, 0.5);
  s.momentum = normal_tensor(n, DType::F32, 23, 0.3);
  if (working_dtype != DType::F32) s.working = Tensor::zeros({n}, working_dtype);
  return s;
}

}  // namespace

TEST_CASE("sgd_step applies sgd_update to every element and refreshes the working copy",
          "[amp_primitives]") {
  struct Config {
    float momentum, dampening, weight_decay;
    bool nesterov, first_step;
  };
  const Config configs[] = {{0.f, 0.f, 0.f, false, false},  {0.9f, 0.f, 0.f, false, true},
                            {0.9f, 0.f, 0.f, false, false}, {0.9f, 0.25f, 0.f, false, false},
                            {0.8f, 0.f, 0.f, true, false},  {0.8f, 0.f, 0.01f, true, true},
                            {0.f, 0.f, 0.05f, false, false}};
  for (DType wdt : {DType::F16, DType::BF16}) {
    for (const Config& c : configs) {
      CAPTURE(wdt, c.momentum, c.dampening, c.weight_decay, c.nesterov, c.first_step);
      SgdHyper hyper;
      hyper.lr = 0.1f;
      hyper.momentum = c.momentum;
      hyper.dampening = c.dampening;
      hyper.weight_decay = c.weight_decay;
      hyper.nesterov = c.nesterov;
      hyper.first_step = c.first_step;

      SgdStepTensors s = make_sgd_state(50000, wdt);
      std::vector<float> w = s.master.to_float_vector();
      std::vector<float> buf = s.momentum.to_float_vector();
      const std::vector<float> g = s.grad.to_float_vector();
      for (size_t i = 0; i < w.size(); ++i) sgd_update(w[i], g[i], buf[i], hyper);

      sgd_step_on(cpu_backend(), hyper, s.master, s.grad, &s.momentum, &s.working, nullptr);
      CHECK(s.master.to_float_vector() == w);
      CHECK(s.momentum.to_float_vector() == buf);
      int64_t wrong = 0;
      for (size_t i = 0; i < w.size(); ++i) {
        const uint16_t expected =
            wdt == DType::F16 ? float_to_half_bits(w[i]) : float_to_bf16_bits(w[i]);
        wrong += bits16(s.working, static_cast<int64_t>(i)) == expected ? 0 : 1;
      }
      CHECK(wrong == 0);
    }
  }

  // Without momentum no buffer is needed, and without a working copy only the master moves.
  SgdStepTensors s = make_sgd_state(10, DType::F32);
  const std::vector<float> w0 = s.master.to_float_vector(), g = s.grad.to_float_vector();
  SgdHyper plain;
  plain.lr = 0.5f;
  sgd_step_on(cpu_backend(), plain, s.master, s.grad, nullptr, nullptr, nullptr);
  for (int64_t i = 0; i < 10; ++i)
    CHECK(s.master.get(i) == static_cast<double>(w0[i] - 0.5f * g[i]));

  // A distinct F32 working tensor is a plain copy of the new master.
  Tensor copy = Tensor::zeros({10});
  sgd_step_on(cpu_backend(), plain, s.master, s.grad, nullptr, &copy, nullptr);
  CHECK(raw_bytes(copy) == raw_bytes(s.master));
}

TEST_CASE("sgd_step with a non-zero found_inf writes nothing", "[amp_primitives]") {
  SgdHyper hyper;
  hyper.lr = 0.1f;
  hyper.momentum = 0.9f;
  hyper.weight_decay = 0.01f;
  SgdStepTensors s = make_sgd_state(40000, DType::F16);
  const auto m0 = raw_bytes(s.master), b0 = raw_bytes(s.momentum), w0 = raw_bytes(s.working);
  for (double flag : {1.0, kInf, std::numeric_limits<double>::quiet_NaN()}) {
    Tensor found_inf = Tensor::full({1}, flag);
    sgd_step_on(cpu_backend(), hyper, s.master, s.grad, &s.momentum, &s.working, &found_inf);
    CHECK(raw_bytes(s.master) == m0);
    CHECK(raw_bytes(s.momentum) == b0);
    CHECK(raw_bytes(s.working) == w0);
  }
  // A zero flag lets the step run.
  Tensor clear = Tensor::zeros({1});
  sgd_step_on(cpu_backend(), hyper, s.master, s.grad, &s.momentum, &s.working, &clear);
  CHECK(raw_bytes(s.master) != m0);
  CHECK(raw_bytes(s.working) != w0);
}

TEST_CASE("sgd_step rejects bad shapes and dtypes naming the primitive", "[amp_primitives]") {
  SgdHyper hyper;
  hyper.momentum = 0.9f;
  SgdStepTensors s = make_sgd_state(6, DType::F16);
  const auto m0 = raw_bytes(s.master);
  auto named = Catch::Contains("sgd_step");

  Tensor half_master = s.master.to(DType::F16);
  CHECK_THROWS_WITH(
      sgd_step_on(cpu_backend(), hyper, half_master, s.grad, &s.momentum, nullptr, nullptr), named);
  Tensor short_grad = Tensor::zeros({5});
  CHECK_THROWS_WITH(
      sgd_step_on(cpu_backend(), hyper, s.master, short_grad, &s.momentum, nullptr, nullptr),
      named);
  Tensor half_grad = s.grad.to(DType::F16);
  CHECK_THROWS_WITH(
      sgd_step_on(cpu_backend(), hyper, s.master, half_grad, &s.momentum, nullptr, nullptr), named);
  CHECK_THROWS_WITH(sgd_step_on(cpu_backend(), hyper, s.master, s.grad, nullptr, nullptr, nullptr),
                    named && Catch::Contains("momentum"));
  Tensor wide_momentum = Tensor::zeros({2, 3});
  CHECK_THROWS_WITH(
      sgd_step_on(cpu_backend(), hyper, s.master, s.grad, &wide_momentum, nullptr, nullptr), named);
  Tensor int_working = Tensor::zeros({6}, DType::I32);
  CHECK_THROWS_WITH(
      sgd_step_on(cpu_backend(), hyper, s.master, s.grad, &s.momentum, &int_working, nullptr),
      named);
  Tensor short_working = Tensor::zeros({5}, DType::F16);
  CHECK_THROWS_WITH(
      sgd_step_on(cpu_backend(), hyper, s.master, s.grad, &s.momentum, &short_working, nullptr),
      named);
  Tensor alias = s.master.detach();
  CHECK_THROWS_WITH(
      sgd_step_on(cpu_backend(), hyper, s.master, s.grad, &s.momentum, &alias, nullptr),
      named && Catch::Contains("null"));
  Tensor half_flag = Tensor::zeros({1}, DType::F16);
  CHECK_THROWS_WITH(
      sgd_step_on(cpu_backend(), hyper, s.master, s.grad, &s.momentum, &s.working, &half_flag),
      named && Catch::Contains("found_inf"));
  CHECK(raw_bytes(s.master) == m0);
}

namespace {

// ---- Adam ------------------------------------------------------------------------------

AdamHyper adam_hyper(float lr, float weight_decay, bool decoupled) {
  AdamHyper hyper;
  hyper.lr = lr;
  hyper.weight_decay = weight_decay;
  hyper.decoupled_weight_decay = decoupled;
  return hyper;
}

// Gradients of every size that matters to Adam: mostly O(1), every fifth near eps (where
// sqrt(v_hat) and eps are of one size, so where eps enters decides the update), every
// seventh exactly zero.
// |t| of an F32 tensor: a valid second moment.
Tensor abs_tensor(const Tensor& t) {
  std::vector<float> v = t.to_float_vector();
  for (float& x : v) x = std::fabs(x);
  return Tensor::from_vector(v, t.shape());
}

std::vector<float> adam_gradients(int64_t n, uint32_t seed) {
  std::vector<float> g = normal_tensor(n, DType::F32, seed, 1.0).to_float_vector();
  for (size_t i = 0; i < g.size(); ++i) {
    if (i % 7 == 3) g[i] = 0.0f;
    else if (i % 5 == 1) g[i] *= 1e-8f;
  }
  return g;
}

// torch.optim.Adam / AdamW in double, written from the algorithm as published (m_hat and
// v_hat explicit), with the FP32 hyperparameters read as doubles. m_size and v_size blend
// the magnitudes |g| + |weight_decay * w| as m and v blend the gradient: the scale of their
// FP32 rounding errors, which cancellation in g + weight_decay * w or in m does not shrink.
struct AdamReference {
  double lr, beta1, beta2, eps, weight_decay;
  bool decoupled;
  std::vector<double> w, m, v, m_size, v_size;

  AdamReference(const AdamHyper& h, const std::vector<float>& w0)
      : lr(h.lr), beta1(h.beta1), beta2(h.beta2), eps(h.eps), weight_decay(h.weight_decay),
        decoupled(h.decoupled_weight_decay), w(w0.begin(), w0.end()), m(w0.size(), 0.0),
        v(w0.size(), 0.0), m_size(w0.size(), 0.0), v_size(w0.size(), 0.0) {}

  void step(int64_t t, const std::vector<float>& g) {
    const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(t));
    const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(t));
    for (size_t i = 0; i < w.size(); ++i) {
      double d = g[i];
      if (decoupled) w[i] *= 1.0 - lr * weight_decay;
      else d += weight_decay * w[i];
      const double size = std::fabs(g[i]) + std::fabs(weight_decay * w[i]);
      m[i] = beta1 * m[i] + (1.0 - beta1) * d;
      v[i] = beta2 * v[i] + (1.0 - beta2) * d * d;
      m_size[i] = beta1 * m_size[i] + (1.0 - beta1) * size;
      v_size[i] = beta2 * v_size[i] + (1.0 - beta2) * size * size;
      const double m_hat = m[i] / bias_correction1, v_hat = v[i] / bias_correction2;
      w[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
};

}  // namespace

TEST_CASE("adam_step follows torch.optim.Adam and AdamW computed in double over several steps",
          "[amp_primitives]") {
  struct Config {
    const char* name;
    float weight_decay;
    bool decoupled;
    DType working;
  };
  const Config configs[] = {{"Adam", 0.0f, false, DType::F16},
                            {"Adam, L2 0.1", 0.1f, false, DType::BF16},
                            {"AdamW 0.1", 0.1f, true, DType::F16},
                            {"AdamW 0", 0.0f, true, DType::BF16}};
  constexpr int64_t kN = 3000;
  constexpr int64_t kSteps = 6;
  constexpr float kLr = 1e-2f;
  for (const Config& c : configs) {
    CAPTURE(c.name);
    AdamHyper hyper = adam_hyper(kLr, c.weight_decay, c.decoupled);
    Tensor master = normal_tensor(kN, DType::F32, 31, 1.0);
    Tensor exp_avg = Tensor::zeros({kN}), exp_avg_sq = Tensor::zeros({kN});
    Tensor working = Tensor::zeros({kN}, c.working);
    AdamReference ref(hyper, master.to_float_vector());
    for (int64_t t = 1; t <= kSteps; ++t) {
      CAPTURE(t);
      const std::vector<float> g = adam_gradients(kN, static_cast<uint32_t>(100 + t));
      hyper.set_step(t);
      adam_step_on(cpu_backend(), hyper, master, Tensor::from_vector(g, {kN}), exp_avg, exp_avg_sq,
                   &working, nullptr);
      ref.step(t, g);

      // Tolerances are a few FP32 roundings per step of each quantity's scale. An update
      // moves w by about lr, so w is held to 1e-5 lr beyond its own roundings: eps under the
      // square root, a missing bias correction or L2 in place of decoupled decay (1e-3 |w|
      // per step here) all miss by far more.
      const std::vector<float> w = master.to_float_vector(), m = exp_avg.to_float_vector(),
                               v = exp_avg_sq.to_float_vector();
      int64_t wrong_w = 0, wrong_m = 0, wrong_v = 0, wrong_working = 0;
      for (size_t i = 0; i < w.size(); ++i) {
        wrong_w += std::fabs(w[i] - ref.w[i]) <= 1e-6 * std::fabs(ref.w[i]) + 1e-5 * kLr ? 0 : 1;
        wrong_m += std::fabs(m[i] - ref.m[i]) <= 2e-6 * ref.m_size[i] ? 0 : 1;
        wrong_v += std::fabs(v[i] - ref.v[i]) <= 2e-6 * ref.v_size[i] ? 0 : 1;
        const uint16_t expected =
            c.working == DType::F16 ? float_to_half_bits(w[i]) : float_to_bf16_bits(w[i]);
        wrong_working += bits16(working, static_cast<int64_t>(i)) == expected ? 0 : 1;
      }
      CHECK(wrong_w == 0);
      CHECK(wrong_m == 0);
      CHECK(wrong_v == 0);
      CHECK(wrong_working == 0);
    }
  }
}

TEST_CASE("adam_step applies adam_update to every element and refreshes the working copy",
          "[amp_primitives]") {
  // 50000 elements: the parallel path is taken as well.
  constexpr int64_t kN = 50000;
  for (bool decoupled : {false, true}) {
    for (DType wdt : {DType::F16, DType::BF16}) {
      CAPTURE(decoupled, wdt);
      AdamHyper hyper = adam_hyper(3e-3f, 0.05f, decoupled);
      hyper.beta1 = 0.8f;
      hyper.beta2 = 0.95f;
      hyper.eps = 1e-6f;
      hyper.set_step(4);
      Tensor master = normal_tensor(kN, DType::F32, 41, 1.0);
      const Tensor grad = normal_tensor(kN, DType::F32, 42, 0.5);
      Tensor exp_avg = normal_tensor(kN, DType::F32, 43, 0.1);
      Tensor exp_avg_sq = abs_tensor(normal_tensor(kN, DType::F32, 44, 0.1));
      Tensor working = Tensor::zeros({kN}, wdt);
      std::vector<float> w = master.to_float_vector(), m = exp_avg.to_float_vector(),
                         v = exp_avg_sq.to_float_vector();
      const std::vector<float> g = grad.to_float_vector();
      for (size_t i = 0; i < w.size(); ++i) adam_update(w[i], g[i], m[i], v[i], hyper);

      adam_step_on(cpu_backend(), hyper, master, grad, exp_avg, exp_avg_sq, &working, nullptr);
      CHECK(master.to_float_vector() == w);
      CHECK(exp_avg.to_float_vector() == m);
      CHECK(exp_avg_sq.to_float_vector() == v);
      int64_t wrong = 0;
      for (size_t i = 0; i < w.size(); ++i) {
        const uint16_t expected =
            wdt == DType::F16 ? float_to_half_bits(w[i]) : float_to_bf16_bits(w[i]);
        wrong += bits16(working, static_cast<int64_t>(i)) == expected ? 0 : 1;
      }
      CHECK(wrong == 0);
    }
  }

  // Without a working copy only the master and the moments move; a distinct F32 working
  // tensor is a plain copy of the new master.
  AdamHyper hyper = adam_hyper(0.1f, 0.0f, false);
  hyper.set_step(1);
  Tensor master = Tensor::from_vector({1.0f, -2.0f}, {2});
  const Tensor grad = Tensor::from_vector({0.5f, -4.0f}, {2});
  Tensor exp_avg = Tensor::zeros({2}), exp_avg_sq = Tensor::zeros({2});
  adam_step_on(cpu_backend(), hyper, master, grad, exp_avg, exp_avg_sq, nullptr, nullptr);
  // The first step moves every weight with a gradient well above eps by almost exactly lr
  // against the gradient's sign: m_hat / sqrt(v_hat) = g / |g|.
  CHECK(master.get(0) == Approx(0.9).epsilon(1e-6));
  CHECK(master.get(1) == Approx(-1.9).epsilon(1e-6));
  Tensor copy = Tensor::zeros({2});
  hyper.set_step(2);
  adam_step_on(cpu_backend(), hyper, master, grad, exp_avg, exp_avg_sq, &copy, nullptr);
  CHECK(raw_bytes(copy) == raw_bytes(master));
}

TEST_CASE("adam_step with a non-zero found_inf writes nothing", "[amp_primitives]") {
  constexpr int64_t kN = 40000;
  AdamHyper hyper = adam_hyper(1e-3f, 0.01f, true);
  hyper.set_step(3);
  Tensor master = normal_tensor(kN, DType::F32, 51, 1.0);
  const Tensor grad = normal_tensor(kN, DType::F32, 52, 1.0);
  Tensor exp_avg = normal_tensor(kN, DType::F32, 53, 0.1);
  Tensor exp_avg_sq = abs_tensor(normal_tensor(kN, DType::F32, 54, 0.1));
  Tensor working = master.to(DType::BF16);
  const auto w0 = raw_bytes(master), m0 = raw_bytes(exp_avg), v0 = raw_bytes(exp_avg_sq),
             c0 = raw_bytes(working);
  for (double flag : {1.0, kInf, std::numeric_limits<double>::quiet_NaN()}) {
    CAPTURE(flag);
    Tensor found_inf = Tensor::full({1}, flag);
    adam_step_on(cpu_backend(), hyper, master, grad, exp_avg, exp_avg_sq, &working, &found_inf);
    CHECK(raw_bytes(master) == w0);
    CHECK(raw_bytes(exp_avg) == m0);
    CHECK(raw_bytes(exp_avg_sq) == v0);
    CHECK(raw_bytes(working) == c0);
  }
  Tensor clear = Tensor::zeros({1});
  adam_step_on(cpu_backend(), hyper, master, grad, exp_avg, exp_avg_sq, &working, &clear);
  CHECK(raw_bytes(master) != w0);
  CHECK(raw_bytes(exp_avg) != m0);
  CHECK(raw_bytes(exp_avg_sq) != v0);
  CHECK(raw_bytes(working) != c0);
}

TEST_CASE("adam_step rejects stale bias corrections and bad operands naming the primitive",
          "[amp_primitives]") {
  AdamHyper hyper = adam_hyper(1e-3f, 0.0f, false);
  Tensor master = normal_tensor(6, DType::F32, 61, 1.0);
  const Tensor grad = normal_tensor(6, DType::F32, 62, 1.0);
  Tensor exp_avg = Tensor::zeros({6}), exp_avg_sq = Tensor::zeros({6});
  Tensor working = Tensor::zeros({6}, DType::F16);
  const auto w0 = raw_bytes(master);
  auto named = Catch::Contains("adam_step");
  auto step = [&](const AdamHyper& h) {
    adam_step_on(cpu_backend(), h, master, grad, exp_avg, exp_avg_sq, &working, nullptr);
  };

  // set_step never called.
  CHECK_THROWS_WITH(step(hyper), named && Catch::Contains("set_step"));
  // A hyperparameter changed after set_step: the derived step size is stale.
  hyper.set_step(1);
  hyper.lr = 2e-3f;
  CHECK_THROWS_WITH(step(hyper), named && Catch::Contains("set_step"));
  // The step moved without set_step.
  hyper.set_step(1);
  hyper.step = 2;
  CHECK_THROWS_WITH(step(hyper), named && Catch::Contains("set_step"));
  // Switching to AdamW after set_step leaves the decay factor stale.
  AdamHyper adamw = adam_hyper(1e-3f, 0.1f, false);
  adamw.set_step(1);
  adamw.decoupled_weight_decay = true;
  CHECK_THROWS_WITH(step(adamw), named);
  struct Bad {
    float lr, beta1, beta2, eps, weight_decay;
  };
  for (const Bad& b :
       {Bad{-1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f}, Bad{1e-3f, 1.0f, 0.999f, 1e-8f, 0.0f},
        Bad{1e-3f, 0.9f, -0.1f, 1e-8f, 0.0f}, Bad{1e-3f, 0.9f, 0.999f, -1e-8f, 0.0f},
        Bad{1e-3f, 0.9f, 0.999f, 1e-8f, -0.1f}}) {
    CAPTURE(b.lr, b.beta1, b.beta2, b.eps, b.weight_decay);
    AdamHyper bad;
    bad.lr = b.lr;
    bad.beta1 = b.beta1;
    bad.beta2 = b.beta2;
    bad.eps = b.eps;
    bad.weight_decay = b.weight_decay;
    bad.set_step(1);
    CHECK_THROWS_WITH(step(bad), named);
  }

  // The valid call, on copies, for contrast with the refusals below.
  hyper.set_step(1);
  Tensor master_copy = master.clone(), avg_copy = exp_avg.clone();
  Tensor avg_sq_copy = exp_avg_sq.clone();
  CHECK_NOTHROW(adam_step_on(cpu_backend(), hyper, master_copy, grad, avg_copy, avg_sq_copy,
                             nullptr, nullptr));
  Tensor half_master = master.to(DType::F16);
  CHECK_THROWS_WITH(
      adam_step_on(cpu_backend(), hyper, half_master, grad, exp_avg, exp_avg_sq, nullptr, nullptr),
      named);
  const Tensor short_grad = Tensor::zeros({5});
  CHECK_THROWS_WITH(
      adam_step_on(cpu_backend(), hyper, master, short_grad, exp_avg, exp_avg_sq, nullptr, nullptr),
      named);
  Tensor half_avg = Tensor::zeros({6}, DType::F16);
  CHECK_THROWS_WITH(
      adam_step_on(cpu_backend(), hyper, master, grad, half_avg, exp_avg_sq, nullptr, nullptr),
      named && Catch::Contains("exp_avg"));
  Tensor wide_avg_sq = Tensor::zeros({2, 3});
  CHECK_THROWS_WITH(
      adam_step_on(cpu_backend(), hyper, master, grad, exp_avg, wide_avg_sq, nullptr, nullptr),
      named && Catch::Contains("exp_avg_sq"));
  Tensor shared = exp_avg.detach();
  CHECK_THROWS_WITH(
      adam_step_on(cpu_backend(), hyper, master, grad, exp_avg, shared, nullptr, nullptr),
      named && Catch::Contains("distinct"));
  Tensor alias = master.detach();
  CHECK_THROWS_WITH(
      adam_step_on(cpu_backend(), hyper, master, grad, exp_avg, exp_avg_sq, &alias, nullptr),
      named && Catch::Contains("null"));
  Tensor int_found = Tensor::zeros({1}, DType::I32);
  CHECK_THROWS_WITH(
      adam_step_on(cpu_backend(), hyper, master, grad, exp_avg, exp_avg_sq, &working, &int_found),
      named && Catch::Contains("found_inf"));
  CHECK(raw_bytes(master) == w0);
  CHECK(exp_avg.to_float_vector() == std::vector<float>(6, 0.0f));
}

// ---- the loss scale on the backend -------------------------------------------------------

namespace {

Tensor state_tensor(const DynamicScaleState& s) {
  Tensor t = Tensor::empty({kDynamicScaleStateWords}, DType::I32);
  std::memcpy(t.data(), &s, sizeof s);
  return t;
}

DynamicScaleState read_state(const Tensor& t) {
  DynamicScaleState s;
  std::memcpy(&s, t.data(), sizeof s);
  return s;
}

DynamicScaleRule small_rule(HysteresisMode mode) {
  DynamicScaleRule rule;
  rule.growth_factor = 2.0;
  rule.backoff_factor = 0.5;
  rule.growth_interval = 2;
  rule.hysteresis = 2;
  rule.hysteresis_mode = mode;
  rule.min_scale = 1.0;
  rule.max_scale = 8.0;
  return rule;
}

// Runs update_loss_scale over `flags` from scale 4 (tracker 0, full hysteresis); returns the
// scale after each step, and checks every step against update_dynamic_scale on a host struct.
std::vector<double> scale_trajectory(const DynamicScaleRule& rule,
                                     const std::vector<double>& flags) {
  DynamicScaleState host{4.0, 0, rule.hysteresis};
  Tensor state = state_tensor(host);
  std::vector<double> scales;
  for (size_t i = 0; i < flags.size(); ++i) {
    CAPTURE(i, flags[i]);
    Tensor found_inf = Tensor::full({1}, flags[i]);
    cpu_backend().update_loss_scale(rule, state, found_inf);
    update_dynamic_scale(rule, host, flags[i] != 0.0);
    const DynamicScaleState s = read_state(state);
    CHECK(s.scale == host.scale);
    CHECK(s.growth_tracker == host.growth_tracker);
    CHECK(s.hysteresis_left == host.hysteresis_left);
    scales.push_back(s.scale);
  }
  return scales;
}

}  // namespace

TEST_CASE("update_loss_scale runs the dynamic scale rule on the state tensor",
          "[amp_primitives]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // Growth interval 2, hysteresis 2 refilled on growth, scale within [1, 8]; worked by hand:
  // grow to 8, reach the ceiling, absorb one overflow, back off twice (hysteresis is not
  // refilled without a growth), a NaN flag backs off to the floor, stay there, grow again
  // and absorb an overflow with the refilled hysteresis.
  const std::vector<double> flags = {0, 0, 0, 0, 1, 1, kInf, 0, nan, 1, 0, 0, 1};
  const std::vector<double> expected = {4, 8, 8, 8, 8, 4, 2, 2, 1, 1, 1, 2, 2};
  CHECK(scale_trajectory(small_rule(HysteresisMode::ResetOnGrowth), flags) == expected);

  // Only consecutive overflows count when every finite step refills the hysteresis.
  const std::vector<double> spaced = {1, 0, 1, 1};
  CHECK(scale_trajectory(small_rule(HysteresisMode::Consecutive), spaced) ==
        std::vector<double>{4, 4, 4, 2});
  CHECK(scale_trajectory(small_rule(HysteresisMode::ResetOnGrowth), spaced) ==
        std::vector<double>{4, 4, 2, 1});
}

TEST_CASE("update_loss_scale rejects bad rules and operands naming the primitive",
          "[amp_primitives]") {
  const DynamicScaleRule rule = small_rule(HysteresisMode::ResetOnGrowth);
  Tensor state = state_tensor(DynamicScaleState{4.0, 0, 2});
  const auto before = raw_bytes(state);
  Tensor found_inf = Tensor::zeros({1});
  auto named = Catch::Contains("update_loss_scale");

  DynamicScaleRule no_growth = rule;
  no_growth.growth_factor = 1.0;
  CHECK_THROWS_WITH(cpu_backend().update_loss_scale(no_growth, state, found_inf), named);
  DynamicScaleRule no_backoff = rule;
  no_backoff.backoff_factor = 1.0;
  CHECK_THROWS_WITH(cpu_backend().update_loss_scale(no_backoff, state, found_inf), named);
  DynamicScaleRule no_interval = rule;
  no_interval.growth_interval = 0;
  CHECK_THROWS_WITH(cpu_backend().update_loss_scale(no_interval, state, found_inf), named);
  DynamicScaleRule inverted = rule;
  inverted.min_scale = 16.0;
  CHECK_THROWS_WITH(cpu_backend().update_loss_scale(inverted, state, found_inf), named);

  Tensor float_state = Tensor::zeros({4});
  CHECK_THROWS_WITH(cpu_backend().update_loss_scale(rule, float_state, found_inf),
                    named && Catch::Contains("I32"));
  Tensor short_state = Tensor::zeros({3}, DType::I32);
  CHECK_THROWS_WITH(cpu_backend().update_loss_scale(rule, short_state, found_inf), named);
  Tensor two_flags = Tensor::zeros({2});
  CHECK_THROWS_WITH(cpu_backend().update_loss_scale(rule, state, two_flags),
                    named && Catch::Contains("found_inf"));
  CHECK(raw_bytes(state) == before);
}
