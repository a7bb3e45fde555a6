// The deferred-step primitives of the CPU backend: the loss-scale factor and the unscale read
// from a scale-state tensor, the clip by the total norm, the optimizer steps that pick their
// per-step values from a rate table by a step counter, and the counter itself. Each is
// checked against what the host would compute with the values it does not know: the
// immediate primitive called with the hyper built by set_step, the unscale by 1 / S, and the
// clip_grad_norm formula written out here in double.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/backend.h"
#include "core/error.h"
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
using mixprec::testing::taken_tensor;
using mixprec_test::raw_bytes;

namespace {

using mixprec_test::adam_step_deferred_on;
using mixprec_test::adam_step_on;
using mixprec_test::sgd_step_deferred_on;
using mixprec_test::sgd_step_on;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The scale-state tensor of a DynamicScaleState with loss scale `scale`.
Tensor scale_state_tensor(double scale) {
  const DynamicScaleState s{scale, 3, 1};
  Tensor t = Tensor::empty({kDynamicScaleStateWords}, DType::I32);
  std::memcpy(t.data(), &s, sizeof s);
  return t;
}

float float_of_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// ---- rate tables, built as a host would before it knows which steps are taken ---------

// Step t0 + j with learning rate lrs[j], derived by set_step on a copy of `base`.
AdamHyper adam_for(const AdamHyper& base, float lr, int64_t step) {
  AdamHyper h = base;
  h.lr = lr;
  h.set_step(step);
  return h;
}

AdamRateTable adam_table_for(const AdamHyper& base, const std::vector<float>& lrs, int64_t t0) {
  AdamRateTable table;
  table.count = static_cast<int32_t>(lrs.size());
  for (size_t j = 0; j < lrs.size(); ++j) {
    const AdamHyper h = adam_for(base, lrs[j], t0 + static_cast<int64_t>(j));
    table.entry[j] = {h.lr, h.step_size, h.bias_correction2_sqrt, h.decay_factor, h.step};
  }
  return table;
}

// Entry 0 starts the momentum buffer when `first` (the parameter's first update).
SgdRateTable sgd_table_for(const std::vector<float>& lrs, bool first) {
  SgdRateTable table;
  table.count = static_cast<int32_t>(lrs.size());
  for (size_t j = 0; j < lrs.size(); ++j)
    table.entry[j] = {lrs[j], first && j == 0 ? 1 : 0};
  return table;
}

// A decaying schedule: distinct learning rates, so a wrong entry shows.
std::vector<float> schedule(int count, float lr0) {
  std::vector<float> lrs;
  for (int j = 0; j < count; ++j) lrs.push_back(lr0 * (1.0f - 0.07f * static_cast<float>(j)));
  return lrs;
}

struct AdamState {
  Tensor master, exp_avg, exp_avg_sq, working;  // working undefined for none
  Tensor* working_ptr() { return working.defined() ? &working : nullptr; }
  AdamState clone() const {
    return {master.clone(), exp_avg.clone(), exp_avg_sq.clone(),
            working.defined() ? working.clone() : Tensor()};
  }
  std::vector<std::vector<uint8_t>> bytes() const {
    return {raw_bytes(master), raw_bytes(exp_avg), raw_bytes(exp_avg_sq),
            working.defined() ? raw_bytes(working) : std::vector<uint8_t>{}};
  }
};

// Mid-training state: moments already non-zero.
AdamState adam_state(int64_t n, bool has_working, DType working_dtype, uint32_t seed) {
  AdamState s;
  s.master = normal_tensor(n, DType::F32, seed, 1.0);
  s.exp_avg = normal_tensor(n, DType::F32, seed + 1, 0.1);
  s.exp_avg_sq = normal_tensor(n, DType::F32, seed + 2, 0.01);
  for (int64_t i = 0; i < n; ++i) s.exp_avg_sq.set(i, s.exp_avg_sq.get(i) * s.exp_avg_sq.get(i));
  if (has_working) s.working = s.master.to(working_dtype);
  return s;
}

struct SgdState {
  Tensor master, momentum, working;
  Tensor* momentum_ptr() { return momentum.defined() ? &momentum : nullptr; }
  Tensor* working_ptr() { return working.defined() ? &working : nullptr; }
  SgdState clone() const {
    return {master.clone(), momentum.defined() ? momentum.clone() : Tensor(),
            working.defined() ? working.clone() : Tensor()};
  }
  std::vector<std::vector<uint8_t>> bytes() const {
    return {raw_bytes(master), momentum.defined() ? raw_bytes(momentum) : std::vector<uint8_t>{},
            working.defined() ? raw_bytes(working) : std::vector<uint8_t>{}};
  }
};

SgdState sgd_state(int64_t n, bool has_momentum, bool has_working, DType working_dtype,
                   uint32_t seed) {
  SgdState s;
  s.master = normal_tensor(n, DType::F32, seed, 1.0);
  if (has_momentum) s.momentum = normal_tensor(n, DType::F32, seed + 1, 0.1);
  if (has_working) s.working = s.master.to(working_dtype);
  return s;
}

}  // namespace

// ---- the optimizer steps ----------------------------------------------------------------

TEST_CASE("deferred adam_step_deferred applies entry taken[0] exactly as adam_step would",
          "[amp]") {
  struct Case {
    bool decoupled;
    float weight_decay;
    bool has_working;
    DType working_dtype;
  };
  // 5000 elements: the parallel path as well as the tail.
  const int64_t n = 5000;
  const Tensor grad = normal_tensor(n, DType::F32, 11, 0.5);
  for (const Case& c : {Case{false, 0.0f, false, DType::F32}, Case{false, 1e-2f, true, DType::BF16},
                        Case{true, 0.1f, true, DType::F16}}) {
    CAPTURE(c.decoupled, c.weight_decay, c.has_working, c.working_dtype);
    AdamHyper base;
    base.lr = 123.0f;  // replaced by every entry's lr
    base.beta1 = 0.85f;
    base.beta2 = 0.995f;
    base.eps = 1e-6f;
    base.weight_decay = c.weight_decay;
    base.decoupled_weight_decay = c.decoupled;
    const std::vector<float> lrs = schedule(5, 2e-3f);
    const int64_t t0 = 7;
    const AdamRateTable table = adam_table_for(base, lrs, t0);
    const AdamState initial = adam_state(n, c.has_working, c.working_dtype, 21);

    std::vector<std::vector<std::vector<uint8_t>>> results;
    for (int32_t j : {0, 2, 4}) {
      CAPTURE(j);
      AdamState deferred = initial.clone();
      const Tensor clear = Tensor::zeros({1});
      adam_step_deferred_on(cpu_backend(), base, table, taken_tensor(j), deferred.master, grad,
                            deferred.exp_avg, deferred.exp_avg_sq, deferred.working_ptr(), clear);
      AdamState immediate = initial.clone();
      adam_step_on(cpu_backend(), adam_for(base, lrs[static_cast<size_t>(j)], t0 + j),
                   immediate.master, grad, immediate.exp_avg, immediate.exp_avg_sq,
                   immediate.working_ptr(), nullptr);
      CHECK(deferred.bytes() == immediate.bytes());
      CHECK(deferred.bytes() != initial.bytes());
      results.push_back(deferred.bytes());
    }
    // Each entry gives its own update: the step and the rate both matter.
    CHECK(results[0][0] != results[1][0]);
    CHECK(results[1][0] != results[2][0]);
  }
}

TEST_CASE("deferred sgd_step_deferred applies entry taken[0] exactly as sgd_step would",
          "[amp]") {
  struct Case {
    float momentum;
    float dampening;
    float weight_decay;
    bool nesterov;
    bool first;  // entry 0 is the parameter's first update
    bool has_working;
    DType working_dtype;
  };
  const int64_t n = 5000;
  const Tensor grad = normal_tensor(n, DType::F32, 31, 0.5);
  for (const Case& c :
       {Case{0.0f, 0.0f, 0.0f, false, false, false, DType::F32},
        Case{0.9f, 0.1f, 1e-2f, false, true, true, DType::F16},
        Case{0.8f, 0.0f, 5e-3f, true, false, true, DType::BF16},
        Case{0.9f, 0.0f, 0.0f, true, true, true, DType::F32}}) {
    CAPTURE(c.momentum, c.dampening, c.weight_decay, c.nesterov, c.first, c.working_dtype);
    SgdHyper base;
    base.lr = 99.0f;  // replaced by every entry's lr
    base.momentum = c.momentum;
    base.dampening = c.dampening;
    base.weight_decay = c.weight_decay;
    base.nesterov = c.nesterov;
    base.first_step = !c.first;  // replaced by every entry's first_step
    const std::vector<float> lrs = schedule(4, 0.05f);
    const SgdRateTable table = sgd_table_for(lrs, c.first);
    const SgdState initial = sgd_state(n, c.momentum != 0.0f, c.has_working, c.working_dtype, 41);

    for (int32_t j : {0, 1, 3}) {
      CAPTURE(j);
      SgdState deferred = initial.clone();
      sgd_step_deferred_on(cpu_backend(), base, table, taken_tensor(j), deferred.master, grad,
                           deferred.momentum_ptr(), deferred.working_ptr(), Tensor::zeros({1}));
      SgdHyper hyper = base;
      hyper.lr = lrs[static_cast<size_t>(j)];
      hyper.first_step = c.first && j == 0;
      SgdState immediate = initial.clone();
      sgd_step_on(cpu_backend(), hyper, immediate.master, grad, immediate.momentum_ptr(),
                  immediate.working_ptr(), nullptr);
      CHECK(deferred.bytes() == immediate.bytes());
      CHECK(deferred.bytes()[0] != initial.bytes()[0]);
      if (c.momentum != 0.0f && c.first && j == 0 && c.weight_decay == 0.0f) {
        // The first update starts the buffer from the gradient, whatever it held.
        CHECK(raw_bytes(deferred.momentum) == raw_bytes(grad));
      }
    }
  }
}

TEST_CASE("deferred steps write nothing when found_inf is set or taken[0] is outside the table",
          "[amp]") {
  const int64_t n = 777;
  const Tensor grad = normal_tensor(n, DType::F32, 51, 0.5);
  AdamHyper adam_base;
  adam_base.weight_decay = 1e-2f;
  const AdamRateTable adam = adam_table_for(adam_base, schedule(3, 1e-3f), 4);
  SgdHyper sgd_base;
  sgd_base.momentum = 0.9f;
  const SgdRateTable sgd = sgd_table_for(schedule(3, 0.1f), true);

  AdamState a = adam_state(n, true, DType::F16, 52);
  SgdState s = sgd_state(n, true, true, DType::BF16, 53);
  const auto a0 = a.bytes();
  const auto s0 = s.bytes();
  struct Skip {
    double flag;
    int32_t j;
  };
  // A set flag with a valid entry (1, NaN, Inf, a negative value), then a clear flag with j
  // at the count, beyond it, and negative.
  for (const Skip& k : {Skip{1.0, 0}, Skip{kNaN, 1}, Skip{kInf, 2}, Skip{-2.0, 0}, Skip{0.0, 3},
                        Skip{0.0, 40}, Skip{0.0, -1}}) {
    CAPTURE(k.flag, k.j);
    const Tensor found_inf = Tensor::full({1}, k.flag);
    adam_step_deferred_on(cpu_backend(), adam_base, adam, taken_tensor(k.j), a.master, grad,
                          a.exp_avg, a.exp_avg_sq, a.working_ptr(), found_inf);
    sgd_step_deferred_on(cpu_backend(), sgd_base, sgd, taken_tensor(k.j), s.master, grad,
                         s.momentum_ptr(), s.working_ptr(), found_inf);
    CHECK(a.bytes() == a0);  // master, both moments and the working copy
    CHECK(s.bytes() == s0);  // master, momentum and the working copy
  }
  // The last entry with a clear flag writes all of them.
  const Tensor clear = Tensor::zeros({1});
  adam_step_deferred_on(cpu_backend(), adam_base, adam, taken_tensor(2), a.master, grad, a.exp_avg,
                        a.exp_avg_sq, a.working_ptr(), clear);
  sgd_step_deferred_on(cpu_backend(), sgd_base, sgd, taken_tensor(2), s.master, grad,
                       s.momentum_ptr(), s.working_ptr(), clear);
  const auto a1 = a.bytes(), s1 = s.bytes();
  for (size_t i = 0; i < a1.size(); ++i) CHECK(a1[i] != a0[i]);
  for (size_t i = 0; i < s1.size(); ++i) CHECK(s1[i] != s0[i]);
}

TEST_CASE("deferred count_taken_step counts only the steps whose flag is zero", "[amp]") {
  Tensor taken = taken_tensor(5);
  // Worked by hand: +1 for 0 and -0, nothing for 1, NaN, Inf, a negative and a tiny
  // non-zero value.
  const std::vector<double> flags = {0.0, 1.0, 0.0, kNaN, -0.0, kInf, -1.0, 1e-30, 0.0};
  const std::vector<int32_t> expected = {6, 6, 7, 7, 8, 8, 8, 8, 9};
  std::vector<int32_t> counts;
  for (double f : flags) {
    cpu_backend().count_taken_step(Tensor::full({1}, f), taken);
    counts.push_back(taken.to_int_vector()[0]);
  }
  CHECK(counts == expected);
}

// ---- the scale read from the state ---------------------------------------------------------

TEST_CASE("deferred loss_scale_factor is S * weight in double rounded once to float",
          "[amp]") {
  Tensor out = Tensor::empty({1});
  auto factor = [&](double scale, double weight) {
    out.data_as<float>()[0] = float_of_bits(0x7FC00001u);  // poison: a NaN
    cpu_backend().loss_scale_factor(scale_state_tensor(scale), weight, out);
    return out.data_as<float>()[0];
  };
  // The case of a non-power-of-two scale: 3 * (1/3) in double is exactly halfway between
  // 1 - 2^-53 and 1, which rounds to even: 1.
  CHECK(factor(3.0, 1.0 / 3.0) == static_cast<float>(3.0 * (1.0 / 3.0)));
  CHECK(factor(3.0, 1.0 / 3.0) == 1.0f);
  // A sweep of scales and accumulation weights; the float-only product differs from the
  // double product rounded once for some of them, so this tells the two apart.
  int64_t wrong = 0, float_product_differs = 0;
  for (double scale : {3.0, 65536.0, 3000.0, 1.5 * 65536.0, 12345.678, 0.75}) {
    for (int k = 1; k <= 24; ++k) {
      for (double weight : {1.0 / k, 0.1 * k, 1.0 / (3.0 * k + 0.5)}) {
        const float expected = static_cast<float>(scale * weight);
        wrong += factor(scale, weight) == expected ? 0 : 1;
        float_product_differs +=
            static_cast<float>(scale) * static_cast<float>(weight) != expected ? 1 : 0;
      }
    }
  }
  CHECK(wrong == 0);
  CHECK(float_product_differs > 0);
}

TEST_CASE("deferred unscale_and_check_on_device equals unscale_and_check by 1 / S bit for bit",
          "[amp]") {
  std::vector<Tensor> inputs = {normal_tensor(3000, DType::F32, 61, 2e3),
                                normal_tensor(5000, DType::F16, 62, 2e3),
                                normal_tensor(777, DType::BF16, 63, 2e3),
                                normal_tensor(0, DType::F32, 64, 1.0),
                                normal_tensor(40000, DType::F32, 65, 2e3)};
  inputs[1].set(17, kInf);
  inputs[2].set(776, kNaN);
  inputs[4].set(39999, -kInf);
  // F16's largest finite value: unscaled by S < 1 it overflows.
  inputs[1].set(4000, 65504.0);
  // S = 1 is a pure check; 0.5 pushes the F16 maximum past the range.
  for (double scale : {3000.0, 65536.0, 1.0, 0.5, 12345.678}) {
    for (double found_before : {0.0, 1.0}) {
      CAPTURE(scale, found_before);
      std::vector<Tensor> device_scaled, host_scaled;
      for (const Tensor& t : inputs) {
        device_scaled.push_back(t.clone());
        host_scaled.push_back(t.clone());
      }
      Tensor device_found = Tensor::full({1}, found_before), host_found = device_found.clone();
      Tensor device_flags = Tensor::full({5}, 7.0, DType::I32), host_flags = device_flags.clone();
      cpu_backend().unscale_and_check_on_device(device_scaled, scale_state_tensor(scale),
                                                device_found, device_flags);
      cpu_backend().unscale_and_check(host_scaled, 1.0 / scale, host_found, host_flags);
      for (size_t i = 0; i < inputs.size(); ++i) {
        CAPTURE(i);
        CHECK(raw_bytes(device_scaled[i]) == raw_bytes(host_scaled[i]));
        if (scale != 1.0 && inputs[i].numel() > 0)
          CHECK(raw_bytes(device_scaled[i]) != raw_bytes(inputs[i]));
      }
      CHECK(raw_bytes(device_flags) == raw_bytes(host_flags));
      CHECK(device_flags.to_int_vector() == std::vector<int32_t>{0, 1, 1, 0, 1});
      CHECK(device_found.item() == 1.0);
    }
  }
  // All finite: the flag stays clear.
  std::vector<Tensor> finite = {normal_tensor(100, DType::BF16, 66, 10.0)};
  Tensor found = Tensor::zeros({1}), flags = Tensor::full({1}, 7.0, DType::I32);
  cpu_backend().unscale_and_check_on_device(finite, scale_state_tensor(1024.0), found, flags);
  CHECK(found.item() == 0.0);
  CHECK(flags.to_int_vector() == std::vector<int32_t>{0});
}

// ---- the clip -------------------------------------------------------------------------------

namespace {

struct ClipRun {
  std::vector<Tensor> grads;
  float norm;
};

ClipRun run_clip(const std::vector<Tensor>& inputs, const Tensor& sums, double max_norm) {
  ClipRun run;
  for (const Tensor& t : inputs) run.grads.push_back(t.clone());
  Tensor norm_out = Tensor::full({1}, -1.0);
  cpu_backend().clip_by_total_norm(run.grads, sums, max_norm, norm_out);
  run.norm = norm_out.data_as<float>()[0];
  return run;
}

}  // namespace

TEST_CASE("deferred clip_by_total_norm follows the clip_grad_norm formula bit for bit", "[amp]") {
  std::vector<Tensor> inputs = {normal_tensor(3000, DType::F32, 71, 0.5),
                                normal_tensor(7, DType::F32, 72, 2.0),
                                normal_tensor(0, DType::F32, 73, 1.0),
                                normal_tensor(20000, DType::F32, 74, 0.1)};
  inputs[1].set(3, -0.0);  // affine_value(-0, a, 0) = +0
  Tensor sums = Tensor::empty({4});
  cpu_backend().squared_norms(inputs, sums);

  // The host formula: the F32 sums added in double in index order, the square root, the
  // coefficient max_norm / (norm + 1e-6), and g * float(coef) + 0 in float.
  double total = 0.0;
  for (float s : sums.to_float_vector()) total += static_cast<double>(s);
  const double norm = std::sqrt(total);
  REQUIRE(norm > 10.0);

  SECTION("a norm above max_norm scales every gradient") {
    const double max_norm = 1.0;
    const ClipRun run = run_clip(inputs, sums, max_norm);
    CHECK(run.norm == static_cast<float>(norm));
    const float alpha = static_cast<float>(max_norm / (norm + 1e-6));
    int64_t wrong = 0;
    for (size_t t = 0; t < inputs.size(); ++t) {
      const std::vector<float> g = inputs[t].to_float_vector(), c = run.grads[t].to_float_vector();
      for (size_t i = 0; i < g.size(); ++i) {
        const float expected = alpha * g[i] + 0.0f;
        wrong += std::memcmp(&expected, &c[i], sizeof expected) == 0 ? 0 : 1;
      }
    }
    CHECK(wrong == 0);
    CHECK(std::signbit(run.grads[1].get(3)) == false);
  }
  SECTION("a norm below max_norm writes nothing") {
    for (double max_norm : {norm * 2.0, norm + 1.0}) {
      const ClipRun run = run_clip(inputs, sums, max_norm);
      CHECK(run.norm == static_cast<float>(norm));
      for (size_t t = 0; t < inputs.size(); ++t)
        CHECK(raw_bytes(run.grads[t]) == raw_bytes(inputs[t]));
    }
  }
  SECTION("a non-finite norm writes nothing and reports Inf or NaN") {
    Tensor inf_sums = sums.clone(), nan_sums = sums.clone();
    inf_sums.set(1, kInf);
    nan_sums.set(3, kNaN);
    const ClipRun inf_run = run_clip(inputs, inf_sums, 1.0);
    CHECK(std::isinf(inf_run.norm));
    const ClipRun nan_run = run_clip(inputs, nan_sums, 1.0);
    CHECK(std::isnan(nan_run.norm));
    for (size_t t = 0; t < inputs.size(); ++t) {
      CHECK(raw_bytes(inf_run.grads[t]) == raw_bytes(inputs[t]));
      CHECK(raw_bytes(nan_run.grads[t]) == raw_bytes(inputs[t]));
    }
  }
  SECTION("no gradients: the norm is 0") {
    const ClipRun run = run_clip({}, Tensor::empty({0}), 1.0);
    CHECK(run.norm == 0.0f);
    CHECK_FALSE(std::signbit(run.norm));
  }
}

// ---- validation ---------------------------------------------------------------------------

TEST_CASE("deferred primitives reject bad operands and tables naming the primitive", "[amp]") {
  const int64_t n = 6;
  Tensor master = normal_tensor(n, DType::F32, 81, 1.0);
  const Tensor grad = normal_tensor(n, DType::F32, 82, 1.0);
  Tensor exp_avg = Tensor::zeros({n}), exp_avg_sq = Tensor::zeros({n});
  Tensor momentum = Tensor::zeros({n}), working = Tensor::zeros({n}, DType::F16);
  const Tensor clear = Tensor::zeros({1});
  const Tensor taken = taken_tensor(0);
  const auto w0 = raw_bytes(master);

  SECTION("adam_step_deferred") {
    auto named = Catch::Contains("adam_step_deferred");
    AdamHyper base;
    base.weight_decay = 1e-2f;
    AdamRateTable table = adam_table_for(base, schedule(5, 1e-3f), 1);
    auto step = [&](const AdamRateTable& t, const Tensor& k, const Tensor& f) {
      adam_step_deferred_on(cpu_backend(), base, t, k, master, grad, exp_avg, exp_avg_sq, &working,
                            f);
    };
    AdamRateTable empty = table;
    empty.count = 0;
    CHECK_THROWS_WITH(step(empty, taken, clear), named && Catch::Contains("count"));
    AdamRateTable too_many = table;
    too_many.count = kMaxDeferredSteps + 1;
    CHECK_THROWS_WITH(step(too_many, taken, clear), named && Catch::Contains("count"));
    // An entry whose step size does not belong to its step (as if the step moved after
    // set_step): named by its index, even though taken selects another entry.
    AdamRateTable stale = table;
    stale.entry[3].step += 1;
    CHECK_THROWS_WITH(step(stale, taken, clear), named && Catch::Contains("entry 3") &&
                                                     Catch::Contains("set_step"));
    AdamRateTable stale_size = table;
    stale_size.entry[4].step_size *= 1.0001f;
    CHECK_THROWS_WITH(step(stale_size, taken, clear), named && Catch::Contains("entry 4"));
    // An entry's lr changed after its derived fields were computed.
    AdamRateTable stale_lr = table;
    stale_lr.entry[1].lr *= 2.0f;
    CHECK_THROWS_WITH(step(stale_lr, taken, clear), named && Catch::Contains("entry 1"));
    AdamRateTable never_set = table;
    never_set.entry[0] = AdamStepRates{};
    CHECK_THROWS_WITH(step(never_set, taken, clear), named && Catch::Contains("step must be"));
    // Base hyperparameters are checked through every entry.
    AdamHyper bad_beta = base;
    bad_beta.beta1 = 1.0f;
    CHECK_THROWS_WITH(adam_step_deferred_on(cpu_backend(), bad_beta, table, taken, master, grad,
                                            exp_avg, exp_avg_sq, &working, clear),
                      named && Catch::Contains("betas"));
    // Entries at and past count are not read.
    AdamRateTable short_table = table;
    short_table.count = 2;
    short_table.entry[2].step_size = -1.0f;
    Tensor skip = Tensor::ones({1});
    CHECK_NOTHROW(step(short_table, taken, skip));
    // The flag and the counter belong to the whole call, which the message names.
    auto call = Catch::Contains("adam_steps");
    CHECK_THROWS_WITH(step(table, Tensor::zeros({1}), clear), call && Catch::Contains("taken"));
    CHECK_THROWS_WITH(step(table, Tensor::from_ints({0, 0}, {2}), clear),
                      call && Catch::Contains("taken"));
    CHECK_THROWS_WITH(step(table, taken, Tensor::zeros({1}, DType::I32)),
                      call && Catch::Contains("found_inf"));
    CHECK_THROWS_WITH(step(table, taken, Tensor()), call && Catch::Contains("found_inf"));
    Tensor short_avg = Tensor::zeros({n - 1});
    CHECK_THROWS_WITH(adam_step_deferred_on(cpu_backend(), base, table, taken, master, grad,
                                            short_avg, exp_avg_sq, nullptr, clear),
                      named && Catch::Contains("exp_avg"));
  }
  SECTION("sgd_step_deferred") {
    auto named = Catch::Contains("sgd_step_deferred");
    SgdHyper base;
    base.momentum = 0.9f;
    const SgdRateTable table = sgd_table_for(schedule(3, 0.1f), false);
    SgdRateTable empty = table;
    empty.count = 0;
    CHECK_THROWS_WITH(sgd_step_deferred_on(cpu_backend(), base, empty, taken, master, grad,
                                           &momentum, &working, clear),
                      named && Catch::Contains("count"));
    SgdRateTable too_many = table;
    too_many.count = kMaxDeferredSteps + 1;
    CHECK_THROWS_WITH(sgd_step_deferred_on(cpu_backend(), base, too_many, taken, master, grad,
                                           &momentum, &working, clear),
                      named && Catch::Contains("count"));
    CHECK_THROWS_WITH(sgd_step_deferred_on(cpu_backend(), base, table, taken, master, grad, nullptr,
                                           &working, clear),
                      named && Catch::Contains("momentum"));
    Tensor half_master = master.to(DType::F16);
    CHECK_THROWS_WITH(sgd_step_deferred_on(cpu_backend(), base, table, taken, half_master, grad,
                                           &momentum, nullptr, clear),
                      named);
    auto call = Catch::Contains("sgd_steps");
    CHECK_THROWS_WITH(sgd_step_deferred_on(cpu_backend(), base, table, Tensor::zeros({1}), master,
                                           grad, &momentum, nullptr, clear),
                      call && Catch::Contains("taken"));
    CHECK_THROWS_WITH(sgd_step_deferred_on(cpu_backend(), base, table, taken, master, grad,
                                           &momentum, nullptr, Tensor::zeros({2})),
                      call && Catch::Contains("found_inf"));
  }
  SECTION("count_taken_step, loss_scale_factor and unscale_and_check_on_device") {
    Tensor counter = taken_tensor(0);
    Tensor float_counter = Tensor::zeros({1});
    CHECK_THROWS_WITH(cpu_backend().count_taken_step(clear, float_counter),
                      Catch::Contains("count_taken_step") && Catch::Contains("taken"));
    CHECK_THROWS_WITH(cpu_backend().count_taken_step(Tensor::zeros({1}, DType::I32), counter),
                      Catch::Contains("count_taken_step") && Catch::Contains("found_inf"));
    CHECK(counter.to_int_vector() == std::vector<int32_t>{0});

    Tensor out = Tensor::zeros({1});
    const Tensor state = scale_state_tensor(4.0);
    auto factor = Catch::Contains("loss_scale_factor");
    CHECK_THROWS_WITH(cpu_backend().loss_scale_factor(Tensor::zeros({4}), 1.0, out),
                      factor && Catch::Contains("scale_state"));
    CHECK_THROWS_WITH(cpu_backend().loss_scale_factor(Tensor::zeros({3}, DType::I32), 1.0, out),
                      factor && Catch::Contains("scale_state"));
    Tensor wide_out = Tensor::zeros({2});
    CHECK_THROWS_WITH(cpu_backend().loss_scale_factor(state, 1.0, wide_out),
                      factor && Catch::Contains("out"));
    Tensor half_out = Tensor::zeros({1}, DType::F16);
    CHECK_THROWS_WITH(cpu_backend().loss_scale_factor(state, 1.0, half_out), factor);
    CHECK_THROWS_WITH(cpu_backend().loss_scale_factor(state, kNaN, out),
                      factor && Catch::Contains("weight"));
    CHECK(out.item() == 0.0);

    auto unscale = Catch::Contains("unscale_and_check_on_device");
    std::vector<Tensor> grads = {normal_tensor(5, DType::F16, 83, 1.0)};
    Tensor found = Tensor::zeros({1}), flags = Tensor::zeros({1}, DType::I32);
    CHECK_THROWS_WITH(
        cpu_backend().unscale_and_check_on_device(grads, Tensor::zeros({4}), found, flags),
        unscale && Catch::Contains("scale_state"));
    Tensor two_flags = Tensor::zeros({2}, DType::I32);
    CHECK_THROWS_WITH(cpu_backend().unscale_and_check_on_device(grads, state, found, two_flags),
                      unscale && Catch::Contains("tensor_flags"));
    std::vector<Tensor> int_grads = {Tensor::zeros({3}, DType::I32)};
    CHECK_THROWS_WITH(cpu_backend().unscale_and_check_on_device(int_grads, state, found, flags),
                      unscale);
  }
  SECTION("clip_by_total_norm") {
    auto named = Catch::Contains("clip_by_total_norm");
    std::vector<Tensor> grads = {normal_tensor(5, DType::F32, 84, 1.0)};
    Tensor sums = Tensor::zeros({1}), norm_out = Tensor::zeros({1});
    CHECK_THROWS_WITH(cpu_backend().clip_by_total_norm(grads, sums, 0.0, norm_out),
                      named && Catch::Contains("max_norm"));
    CHECK_THROWS_WITH(cpu_backend().clip_by_total_norm(grads, sums, kInf, norm_out),
                      named && Catch::Contains("max_norm"));
    CHECK_THROWS_WITH(cpu_backend().clip_by_total_norm(grads, Tensor::zeros({2}), 1.0, norm_out),
                      named && Catch::Contains("squared_sums"));
    CHECK_THROWS_WITH(
        cpu_backend().clip_by_total_norm(grads, Tensor::zeros({1}, DType::F16), 1.0, norm_out),
        named && Catch::Contains("squared_sums"));
    Tensor wide_norm = Tensor::zeros({2});
    CHECK_THROWS_WITH(cpu_backend().clip_by_total_norm(grads, sums, 1.0, wide_norm),
                      named && Catch::Contains("norm_out"));
    std::vector<Tensor> half_grads = {normal_tensor(5, DType::F16, 85, 1.0)};
    CHECK_THROWS_WITH(cpu_backend().clip_by_total_norm(half_grads, sums, 1.0, norm_out),
                      named && Catch::Contains("F32"));
  }
  CHECK(raw_bytes(master) == w0);
}
