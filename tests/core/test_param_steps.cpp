// The multi-tensor optimizer steps of the CPU backend (Backend::adam_steps / sgd_steps in
// core/cpu/cpu_amp.cpp): one call over parameters of different sizes,
// working copies and hyperparameters must leave every master, state buffer and working copy
// with the bits of the per-parameter primitive (adam_step, sgd_step and their deferred forms)
// run on clones; a deferred call picks each parameter's own entry j or leaves the parameter
// alone when j is past its table; and a bad call throws a mixprec::Error naming the step
// before anything is written, so no parameter is left half-updated.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/error.h"
#include "core/math/amp.h"
#include "core/tensor.h"
#include "tests/core/cpu_test_util.h"
#include "tests/core/gradcheck.h"
#include "tests/error_message.h"
#include "tests/param_step_calls.h"

using namespace mixprec;
using mixprec::testing::bits_of;
using mixprec::testing::cpu_backend;
using mixprec::testing::normal_tensor;
using mixprec::testing::taken_tensor;
using mixprec_test::error_message;

namespace {

using mixprec_test::adam_step_deferred_on;
using mixprec_test::adam_step_on;
using mixprec_test::sgd_step_deferred_on;
using mixprec_test::sgd_step_on;

// The working copy a parameter carries: none, a 16-bit one, or an F32 tensor distinct from
// the master.
enum class Working { None, F16, BF16, F32 };

Tensor working_copy(const Tensor& master, Working w) {
  switch (w) {
    case Working::None: return Tensor();
    case Working::F16: return master.to(DType::F16);
    case Working::BF16: return master.to(DType::BF16);
    case Working::F32: return master.clone();
  }
  return Tensor();
}

Tensor clone_or_none(const Tensor& t) { return t.defined() ? t.clone() : Tensor(); }
std::vector<uint32_t> bits_or_none(const Tensor& t) {
  return t.defined() ? bits_of(t) : std::vector<uint32_t>{};
}

// ---- Adam ------------------------------------------------------------------------------

// One parameter's operands and its (base or complete) hyperparameters.
struct AdamParam {
  AdamHyper hyper;
  Tensor master, grad, exp_avg, exp_avg_sq, working;  // working undefined: none

  AdamParam clone() const {
    return {hyper, master.clone(), grad, exp_avg.clone(), exp_avg_sq.clone(),
            clone_or_none(working)};
  }
  Tensor* working_ptr() { return working.defined() ? &working : nullptr; }
  // Pointers into this object: it must not move while the step is in use.
  AdamParamStep step(const AdamRateTable* table = nullptr) {
    return {hyper, table, &master, &grad, &exp_avg, &exp_avg_sq, working_ptr()};
  }
  // Everything a step may write.
  std::vector<std::vector<uint32_t>> bits() const {
    return {bits_of(master), bits_of(exp_avg), bits_of(exp_avg_sq), bits_or_none(working)};
  }
};

struct AdamSpec {
  int64_t numel;
  float weight_decay;
  bool decoupled;  // AdamW
  int64_t step;    // for an immediate step
  Working working;
};

// Mid-training state (non-zero moments) with distinct hyperparameters per parameter, so a
// step that used another parameter's values would show.
AdamParam adam_param(const AdamSpec& s, uint32_t seed) {
  AdamParam p;
  p.hyper.lr = 1e-3f * static_cast<float>(1 + seed % 7);
  p.hyper.beta1 = 0.9f - 0.01f * static_cast<float>(seed % 3);
  p.hyper.beta2 = 0.999f - 0.002f * static_cast<float>(seed % 4);
  p.hyper.eps = seed % 2 == 0 ? 1e-8f : 1e-6f;
  p.hyper.weight_decay = s.weight_decay;
  p.hyper.decoupled_weight_decay = s.decoupled;
  p.hyper.set_step(s.step);
  p.master = normal_tensor(s.numel, DType::F32, seed, 1.0);
  p.grad = normal_tensor(s.numel, DType::F32, seed + 1, 0.5);
  p.exp_avg = normal_tensor(s.numel, DType::F32, seed + 2, 0.1);
  p.exp_avg_sq = normal_tensor(s.numel, DType::F32, seed + 3, 0.1);
  for (int64_t i = 0; i < s.numel; ++i) {
    const double v = p.exp_avg_sq.get(i);
    p.exp_avg_sq.set(i, v * v);  // a second moment is not negative
  }
  p.working = working_copy(p.master, s.working);
  return p;
}

// Sizes 1, 7, 4097 (past one 4096-element piece) and 0 among others; Adam and AdamW, with
// and without weight decay, different steps, and every kind of working copy.
std::vector<AdamParam> adam_params(uint32_t seed) {
  const std::vector<AdamSpec> specs = {
      {1, 0.0f, false, 1, Working::None},      {7, 1e-2f, false, 3, Working::F16},
      {4097, 0.1f, true, 10, Working::BF16},   {0, 0.0f, false, 2, Working::F16},
      {300, 5e-2f, true, 1, Working::F32},     {5000, 0.0f, false, 100, Working::None},
      {33, 0.0f, true, 7, Working::BF16}};
  std::vector<AdamParam> params;
  for (size_t i = 0; i < specs.size(); ++i)
    params.push_back(adam_param(specs[i], seed + 10 * static_cast<uint32_t>(i)));
  return params;
}

std::vector<AdamParam> clones(const std::vector<AdamParam>& ps) {
  std::vector<AdamParam> out;
  for (const AdamParam& p : ps) out.push_back(p.clone());
  return out;
}

// `tables` null: immediate steps; else parameter i uses (*tables)[i].
std::vector<AdamParamStep> steps_of(std::vector<AdamParam>& ps,
                                    const std::vector<AdamRateTable>* tables = nullptr) {
  std::vector<AdamParamStep> steps;
  for (size_t i = 0; i < ps.size(); ++i)
    steps.push_back(ps[i].step(tables != nullptr ? &(*tables)[i] : nullptr));
  return steps;
}

// Entry j: step t0 + j at a decaying learning rate, derived by set_step as a host would.
AdamRateTable adam_table(const AdamHyper& base, int32_t count, int64_t t0, float lr0) {
  AdamRateTable table;
  table.count = count;
  for (int32_t j = 0; j < count; ++j) {
    AdamHyper h = base;
    h.lr = lr0 * (1.0f - 0.01f * static_cast<float>(j));
    h.set_step(t0 + j);
    table.entry[j] = rates_of(h);
  }
  return table;
}

// ---- SGD -------------------------------------------------------------------------------

struct SgdParam {
  SgdHyper hyper;
  Tensor master, grad, momentum, working;  // momentum, working undefined: none

  SgdParam clone() const {
    return {hyper, master.clone(), grad, clone_or_none(momentum), clone_or_none(working)};
  }
  Tensor* momentum_ptr() { return momentum.defined() ? &momentum : nullptr; }
  Tensor* working_ptr() { return working.defined() ? &working : nullptr; }
  SgdParamStep step(const SgdRateTable* table = nullptr) {
    return {hyper, table, &master, &grad, momentum_ptr(), working_ptr()};
  }
  std::vector<std::vector<uint32_t>> bits() const {
    return {bits_of(master), bits_or_none(momentum), bits_or_none(working)};
  }
};

struct SgdSpec {
  int64_t numel;
  float momentum;
  float dampening;
  float weight_decay;
  bool nesterov;
  bool first_step;
  bool buffer;  // a momentum buffer is passed (also where momentum is 0: it stays untouched)
  Working working;
};

SgdParam sgd_param(const SgdSpec& s, uint32_t seed) {
  SgdParam p;
  p.hyper.lr = 0.01f * static_cast<float>(1 + seed % 5);
  p.hyper.momentum = s.momentum;
  p.hyper.dampening = s.dampening;
  p.hyper.weight_decay = s.weight_decay;
  p.hyper.nesterov = s.nesterov;
  p.hyper.first_step = s.first_step;
  p.master = normal_tensor(s.numel, DType::F32, seed, 1.0);
  p.grad = normal_tensor(s.numel, DType::F32, seed + 1, 0.5);
  if (s.buffer) p.momentum = normal_tensor(s.numel, DType::F32, seed + 2, 0.3);
  p.working = working_copy(p.master, s.working);
  return p;
}

// No momentum; momentum on its first step and later (with dampening); Nesterov; weight
// decay; a buffer passed without momentum; every kind of working copy; sizes as for Adam.
std::vector<SgdParam> sgd_params(uint32_t seed) {
  const std::vector<SgdSpec> specs = {
      {1, 0.0f, 0.0f, 0.0f, false, false, false, Working::None},
      {7, 0.9f, 0.1f, 0.0f, false, true, true, Working::F16},
      {4097, 0.9f, 0.1f, 1e-2f, false, false, true, Working::BF16},
      {0, 0.8f, 0.0f, 0.0f, true, false, true, Working::F32},
      {300, 0.8f, 0.0f, 5e-3f, true, false, true, Working::F32},
      {5000, 0.0f, 0.0f, 1e-2f, false, false, true, Working::None},
      {33, 0.7f, 0.0f, 0.0f, true, true, true, Working::BF16}};
  std::vector<SgdParam> params;
  for (size_t i = 0; i < specs.size(); ++i)
    params.push_back(sgd_param(specs[i], seed + 10 * static_cast<uint32_t>(i)));
  return params;
}

std::vector<SgdParam> clones(const std::vector<SgdParam>& ps) {
  std::vector<SgdParam> out;
  for (const SgdParam& p : ps) out.push_back(p.clone());
  return out;
}

std::vector<SgdParamStep> steps_of(std::vector<SgdParam>& ps,
                                   const std::vector<SgdRateTable>* tables = nullptr) {
  std::vector<SgdParamStep> steps;
  for (size_t i = 0; i < ps.size(); ++i)
    steps.push_back(ps[i].step(tables != nullptr ? &(*tables)[i] : nullptr));
  return steps;
}

// Entry j at a decaying learning rate; entry 0 starts the buffer when `first`.
SgdRateTable sgd_table(int32_t count, float lr0, bool first) {
  SgdRateTable table;
  table.count = count;
  for (int32_t j = 0; j < count; ++j)
    table.entry[j] = {lr0 * (1.0f - 0.02f * static_cast<float>(j)), first && j == 0 ? 1 : 0};
  return table;
}

}  // namespace

// ---- immediate steps ---------------------------------------------------------------------

// The per-parameter primitives and the multi-tensor call share one runner on the CPU, so the
// two tests below hold the call's dispatch and order (each step its own hyper, operands and
// table entry); the arithmetic itself is held to PyTorch's by test_amp_primitives.cpp.
TEST_CASE("adam_steps updates every parameter as adam_step would, bit for bit", "[amp]") {
  const std::vector<AdamParam> initial = adam_params(100);
  // No flag, and a clear one (a step whose flag the device wrote as 0).
  for (bool with_flag : {false, true}) {
    CAPTURE(with_flag);
    const Tensor clear = Tensor::zeros({1});
    const Tensor* found_inf = with_flag ? &clear : nullptr;
    std::vector<AdamParam> together = clones(initial), each = clones(initial);
    cpu_backend().adam_steps(steps_of(together), nullptr, found_inf);
    for (AdamParam& p : each) {
      adam_step_on(cpu_backend(), p.hyper, p.master, p.grad, p.exp_avg, p.exp_avg_sq,
                   p.working_ptr(), found_inf);
    }
    for (size_t i = 0; i < initial.size(); ++i) {
      CAPTURE(i, initial[i].master.numel());
      CHECK(together[i].bits() == each[i].bits());
      // Every buffer of a non-empty parameter moved.
      if (initial[i].master.numel() == 0) continue;
      const auto before = initial[i].bits(), after = together[i].bits();
      for (size_t b = 0; b < before.size(); ++b) {
        if (!before[b].empty()) CHECK(after[b] != before[b]);
      }
    }
  }
}

TEST_CASE("sgd_steps updates every parameter as sgd_step would, bit for bit", "[amp]") {
  const std::vector<SgdParam> initial = sgd_params(200);
  std::vector<SgdParam> together = clones(initial), each = clones(initial);
  cpu_backend().sgd_steps(steps_of(together), nullptr, nullptr);
  for (SgdParam& p : each)
    sgd_step_on(cpu_backend(), p.hyper, p.master, p.grad, p.momentum_ptr(), p.working_ptr(),
                nullptr);
  for (size_t i = 0; i < initial.size(); ++i) {
    CAPTURE(i, initial[i].master.numel());
    CHECK(together[i].bits() == each[i].bits());
    if (initial[i].master.numel() == 0) continue;
    CHECK(bits_of(together[i].master) != bits_of(initial[i].master));
    // A buffer passed without momentum is not the step's business.
    if (initial[i].momentum.defined() && initial[i].hyper.momentum == 0.0f)
      CHECK(bits_of(together[i].momentum) == bits_of(initial[i].momentum));
  }
  // Parameter 1's first step starts its buffer from the gradient, whatever it held.
  CHECK(bits_of(together[1].momentum) == bits_of(initial[1].grad));
}

TEST_CASE("immediate adam_steps and sgd_steps write nothing when found_inf is set", "[amp]") {
  const std::vector<AdamParam> adam_initial = adam_params(300);
  const std::vector<SgdParam> sgd_initial = sgd_params(400);
  for (double flag : {1.0, std::numeric_limits<double>::quiet_NaN()}) {
    CAPTURE(flag);
    const Tensor found_inf = Tensor::full({1}, flag);
    std::vector<AdamParam> adam = clones(adam_initial);
    std::vector<SgdParam> sgd = clones(sgd_initial);
    cpu_backend().adam_steps(steps_of(adam), nullptr, &found_inf);
    cpu_backend().sgd_steps(steps_of(sgd), nullptr, &found_inf);
    for (size_t i = 0; i < adam.size(); ++i) CHECK(adam[i].bits() == adam_initial[i].bits());
    for (size_t i = 0; i < sgd.size(); ++i) CHECK(sgd[i].bits() == sgd_initial[i].bits());
  }
}

// ---- deferred steps ----------------------------------------------------------------------

TEST_CASE("adam_steps with taken applies entry j of each parameter's own table", "[amp]") {
  const std::vector<AdamParam> initial = adam_params(500);
  // Counts 1 and 2 for parameters 0 and 3 (3 is empty), up to kMaxDeferredSteps: at j = 2
  // parameter 0 sits the step out while the others update; at j = 5 only the tables of 64
  // and 6 entries reach.
  const std::vector<int32_t> counts = {1, 3, 5, 2, kMaxDeferredSteps, 3, 6};
  REQUIRE(counts.size() == initial.size());
  std::vector<AdamRateTable> tables;
  for (size_t i = 0; i < initial.size(); ++i) {
    tables.push_back(adam_table(initial[i].hyper, counts[i], 4 + static_cast<int64_t>(i),
                                2e-3f * static_cast<float>(i + 1)));
  }
  const Tensor clear = Tensor::zeros({1});
  for (int32_t j : {0, 2, 5}) {
    CAPTURE(j);
    const Tensor taken = taken_tensor(j);
    std::vector<AdamParam> together = clones(initial), each = clones(initial);
    cpu_backend().adam_steps(steps_of(together, &tables), &taken, &clear);
    for (size_t i = 0; i < each.size(); ++i) {
      AdamParam& p = each[i];
      adam_step_deferred_on(cpu_backend(), p.hyper, tables[i], taken, p.master, p.grad, p.exp_avg,
                            p.exp_avg_sq, p.working_ptr(), clear);
    }
    for (size_t i = 0; i < initial.size(); ++i) {
      CAPTURE(i, counts[i]);
      CHECK(together[i].bits() == each[i].bits());
      if (initial[i].master.numel() == 0) continue;
      // Past its table the parameter is untouched; within it, master and moments move.
      const bool updates = j < counts[i];
      CHECK((bits_of(together[i].master) != bits_of(initial[i].master)) == updates);
      CHECK((bits_of(together[i].exp_avg_sq) != bits_of(initial[i].exp_avg_sq)) == updates);
    }
    // Entry j is the immediate step t0 + j at its own rate: parameter 4 (AdamW, an F32
    // copy, the one table that every j reaches).
    AdamParam immediate = initial[4].clone();
    immediate.hyper.lr = tables[4].entry[j].lr;
    immediate.hyper.set_step(4 + 4 + j);
    adam_step_on(cpu_backend(), immediate.hyper, immediate.master, immediate.grad,
                 immediate.exp_avg, immediate.exp_avg_sq, immediate.working_ptr(), nullptr);
    CHECK(together[4].bits() == immediate.bits());
  }
}

TEST_CASE("sgd_steps with taken applies entry j of each parameter's own table", "[amp]") {
  const std::vector<SgdParam> initial = sgd_params(600);
  const std::vector<int32_t> counts = {1, 3, 5, 2, kMaxDeferredSteps, 3, 6};
  REQUIRE(counts.size() == initial.size());
  std::vector<SgdRateTable> tables;
  for (size_t i = 0; i < initial.size(); ++i) {
    // Entry 0 starts the buffer of the parameters that have not had an update yet.
    tables.push_back(sgd_table(counts[i], 0.05f * static_cast<float>(i + 1),
                               initial[i].hyper.first_step));
  }
  const Tensor clear = Tensor::zeros({1});
  for (int32_t j : {0, 2, 5}) {
    CAPTURE(j);
    const Tensor taken = taken_tensor(j);
    std::vector<SgdParam> together = clones(initial), each = clones(initial);
    cpu_backend().sgd_steps(steps_of(together, &tables), &taken, &clear);
    for (size_t i = 0; i < each.size(); ++i) {
      SgdParam& p = each[i];
      sgd_step_deferred_on(cpu_backend(), p.hyper, tables[i], taken, p.master, p.grad,
                           p.momentum_ptr(), p.working_ptr(), clear);
    }
    for (size_t i = 0; i < initial.size(); ++i) {
      CAPTURE(i, counts[i]);
      CHECK(together[i].bits() == each[i].bits());
      if (initial[i].master.numel() == 0) continue;
      CHECK((bits_of(together[i].master) != bits_of(initial[i].master)) == (j < counts[i]));
    }
    // Entry j as an immediate step: parameter 4 (Nesterov, weight decay, an F32 copy, the
    // one table that every j reaches).
    SgdParam immediate = initial[4].clone();
    immediate.hyper.lr = tables[4].entry[j].lr;
    immediate.hyper.first_step = false;
    sgd_step_on(cpu_backend(), immediate.hyper, immediate.master, immediate.grad,
                immediate.momentum_ptr(), immediate.working_ptr(), nullptr);
    CHECK(together[4].bits() == immediate.bits());
  }
}

TEST_CASE("deferred adam_steps and sgd_steps write nothing when found_inf is set", "[amp]") {
  const std::vector<AdamParam> adam_initial = adam_params(700);
  const std::vector<SgdParam> sgd_initial = sgd_params(800);
  std::vector<AdamRateTable> adam_tables;
  for (const AdamParam& p : adam_initial) adam_tables.push_back(adam_table(p.hyper, 3, 2, 1e-3f));
  std::vector<SgdRateTable> sgd_tables;
  for (size_t i = 0; i < sgd_initial.size(); ++i) sgd_tables.push_back(sgd_table(3, 0.1f, true));
  const Tensor taken = taken_tensor(1);
  for (double flag : {1.0, -1.0, std::numeric_limits<double>::quiet_NaN()}) {
    CAPTURE(flag);
    const Tensor found_inf = Tensor::full({1}, flag);
    std::vector<AdamParam> adam = clones(adam_initial);
    std::vector<SgdParam> sgd = clones(sgd_initial);
    cpu_backend().adam_steps(steps_of(adam, &adam_tables), &taken, &found_inf);
    cpu_backend().sgd_steps(steps_of(sgd, &sgd_tables), &taken, &found_inf);
    for (size_t i = 0; i < adam.size(); ++i) CHECK(adam[i].bits() == adam_initial[i].bits());
    for (size_t i = 0; i < sgd.size(); ++i) CHECK(sgd[i].bits() == sgd_initial[i].bits());
  }
  // The same call with a clear flag does write: the skip above was the flag's doing.
  std::vector<AdamParam> adam = clones(adam_initial);
  const Tensor clear = Tensor::zeros({1});
  cpu_backend().adam_steps(steps_of(adam, &adam_tables), &taken, &clear);
  CHECK(bits_of(adam[0].master) != bits_of(adam_initial[0].master));
}

// ---- contract errors ---------------------------------------------------------------------

namespace {

// Four Adam parameters of six elements (so that any two could be swapped) whose masters,
// moments and working copies must come through a rejected call unchanged.
struct AdamCall {
  std::vector<AdamParam> params;
  std::vector<std::vector<std::vector<uint32_t>>> before;
  std::vector<AdamRateTable> tables;
  AdamCall() {
    for (uint32_t i = 0; i < 4; ++i) {
      params.push_back(adam_param({6, 0.01f, i % 2 == 1, 2, i % 2 == 0 ? Working::F16
                                                                          : Working::None},
                                  900 + 10 * i));
      tables.push_back(adam_table(params.back().hyper, 2, 1, 1e-3f));
    }
    for (const AdamParam& p : params) before.push_back(p.bits());
  }
  void expect_untouched() const {
    for (size_t i = 0; i < params.size(); ++i) {
      CAPTURE(i);
      CHECK(params[i].bits() == before[i]);
    }
  }
};

struct SgdCall {
  std::vector<SgdParam> params;
  std::vector<std::vector<std::vector<uint32_t>>> before;
  std::vector<SgdRateTable> tables;
  SgdCall() {
    for (uint32_t i = 0; i < 4; ++i) {
      params.push_back(sgd_param({6, 0.9f, 0.0f, 0.0f, i == 3, false, true,
                                  i % 2 == 0 ? Working::BF16 : Working::None},
                                 950 + 10 * i));
      tables.push_back(sgd_table(2, 0.1f, false));
    }
    for (const SgdParam& p : params) before.push_back(p.bits());
  }
  void expect_untouched() const {
    for (size_t i = 0; i < params.size(); ++i) {
      CAPTURE(i);
      CHECK(params[i].bits() == before[i]);
    }
  }
};

}  // namespace

TEST_CASE("adam_steps rejects a bad call before it writes any parameter", "[amp]") {
  AdamCall call;
  std::vector<AdamParamStep> immediate = steps_of(call.params);
  std::vector<AdamParamStep> deferred = steps_of(call.params, &call.tables);
  const Tensor taken = taken_tensor(0), clear = Tensor::zeros({1});
  auto run = [&](const std::vector<AdamParamStep>& steps, const Tensor* k, const Tensor* f) {
    return error_message([&] { cpu_backend().adam_steps(steps, k, f); });
  };
  auto named = Catch::Contains("adam_steps");

  SECTION("a deferred call without found_inf") {
    CHECK_THAT(run(deferred, &taken, nullptr), named && Catch::Contains("needs found_inf"));
  }
  SECTION("a rate table on an immediate step") {
    immediate[1].table = &call.tables[1];
    CHECK_THAT(run(immediate, nullptr, nullptr),
               named && Catch::Contains("step 1 has a rate table"));
  }
  SECTION("a deferred step without its rate table") {
    deferred[3].table = nullptr;
    CHECK_THAT(run(deferred, &taken, &clear), named && Catch::Contains("step 3 has no rate table"));
  }
  SECTION("two steps sharing one master") {
    // Step 2 is otherwise valid: the same shape, its own moments and gradient.
    immediate[2].master = immediate[0].master;
    CHECK_THAT(run(immediate, nullptr, nullptr),
               named && Catch::Contains("steps 0 and 2 share memory"));
  }
  SECTION("step 2 of 4 with a gradient of the wrong shape") {
    const Tensor short_grad = normal_tensor(5, DType::F32, 1, 1.0);
    immediate[2].grad = &short_grad;
    deferred[2].grad = &short_grad;
    // As adam_step words it, prefixed with the step.
    CHECK_THAT(run(immediate, nullptr, nullptr),
               named && Catch::Contains("step 2 of 4") &&
                   Catch::Contains("adam_step: the gradient"));
    CHECK_THAT(run(deferred, &taken, &clear),
               named && Catch::Contains("step 2 of 4") &&
                   Catch::Contains("adam_step_deferred: the gradient"));
  }
  SECTION("a null exp_avg") {
    immediate[1].exp_avg = nullptr;
    CHECK_THAT(run(immediate, nullptr, nullptr),
               named && Catch::Contains("step 1") && Catch::Contains("exp_avg"));
  }
  SECTION("a null master or gradient") {
    immediate[3].master = nullptr;
    CHECK_THAT(run(immediate, nullptr, nullptr), named && Catch::Contains("step 3 has no master"));
    immediate[3].master = &call.params[3].master;
    immediate[0].grad = nullptr;
    CHECK_THAT(run(immediate, nullptr, nullptr),
               named && Catch::Contains("step 0 has no gradient"));
  }
  SECTION("a hyper without set_step on the last step") {
    immediate[3].hyper.step = 0;
    CHECK_THAT(run(immediate, nullptr, nullptr),
               named && Catch::Contains("step 3 of 4") && Catch::Contains("set_step"));
  }
  SECTION("a stale table entry, a bad counter and a bad flag") {
    AdamRateTable stale = call.tables[2];
    stale.entry[1].step += 1;
    deferred[2].table = &stale;
    CHECK_THAT(run(deferred, &taken, &clear),
               named && Catch::Contains("step 2 of 4") && Catch::Contains("entry 1"));
    deferred[2].table = &call.tables[2];
    const Tensor float_taken = Tensor::zeros({1});
    CHECK_THAT(run(deferred, &float_taken, &clear), named && Catch::Contains("taken"));
    const Tensor int_flag = Tensor::zeros({1}, DType::I32);
    CHECK_THAT(run(immediate, nullptr, &int_flag), named && Catch::Contains("found_inf"));
  }
  SECTION("a table shared by two steps is checked against each step's base") {
    // A table is checked once per call for steps that share it and their base; step 1's
    // base must still be checked when it differs from step 0's.
    const AdamRateTable shared = adam_table(call.params[0].hyper, 2, 4, 2e-3f);
    deferred[0].table = &shared;
    deferred[1].table = &shared;
    deferred[1].hyper = deferred[0].hyper;
    AdamRateTable stale = call.tables[3];
    stale.entry[0].step += 1;
    deferred[3].table = &stale;
    // Steps 0 to 2 pass: the call is refused at step 3.
    CHECK_THAT(run(deferred, &taken, &clear), named && Catch::Contains("step 3 of 4"));
    deferred[1].hyper.beta1 = deferred[0].hyper.beta1 / 2;  // the step sizes no longer match
    CHECK_THAT(run(deferred, &taken, &clear),
               named && Catch::Contains("step 1 of 4") && Catch::Contains("entry 0"));
    deferred[1].hyper = deferred[0].hyper;
    deferred[1].hyper.eps = deferred[0].hyper.eps * 2;  // not in the table: passes again
    CHECK_THAT(run(deferred, &taken, &clear), named && Catch::Contains("step 3 of 4"));
  }
  call.expect_untouched();
}

TEST_CASE("sgd_steps rejects a bad call before it writes any parameter", "[amp]") {
  SgdCall call;
  std::vector<SgdParamStep> immediate = steps_of(call.params);
  std::vector<SgdParamStep> deferred = steps_of(call.params, &call.tables);
  const Tensor taken = taken_tensor(0), clear = Tensor::zeros({1});
  auto run = [&](const std::vector<SgdParamStep>& steps, const Tensor* k, const Tensor* f) {
    return error_message([&] { cpu_backend().sgd_steps(steps, k, f); });
  };
  auto named = Catch::Contains("sgd_steps");

  SECTION("a deferred call without found_inf") {
    CHECK_THAT(run(deferred, &taken, nullptr), named && Catch::Contains("needs found_inf"));
  }
  SECTION("a rate table on an immediate step") {
    immediate[0].table = &call.tables[0];
    CHECK_THAT(run(immediate, nullptr, nullptr),
               named && Catch::Contains("step 0 has a rate table"));
  }
  SECTION("a deferred step without its rate table") {
    deferred[2].table = nullptr;
    CHECK_THAT(run(deferred, &taken, &clear), named && Catch::Contains("step 2 has no rate table"));
  }
  SECTION("two steps sharing one master") {
    immediate[3].master = immediate[1].master;
    CHECK_THAT(run(immediate, nullptr, nullptr),
               named && Catch::Contains("steps 1 and 3 share memory"));
  }
  SECTION("step 2 of 4 with a gradient of the wrong shape") {
    const Tensor short_grad = normal_tensor(5, DType::F32, 1, 1.0);
    immediate[2].grad = &short_grad;
    CHECK_THAT(run(immediate, nullptr, nullptr),
               named && Catch::Contains("step 2 of 4") &&
                   Catch::Contains("sgd_step: the gradient"));
  }
  SECTION("momentum without a buffer") {
    immediate[1].momentum = nullptr;
    CHECK_THAT(run(immediate, nullptr, nullptr),
               named && Catch::Contains("step 1 of 4") && Catch::Contains("momentum buffer"));
  }
  call.expect_untouched();
}

// ---- the rates of an immediate step, and empty calls ---------------------------------------

TEST_CASE("rates_of gives an immediate step's hyper back through the hyper_with functions",
          "[amp]") {
  AdamHyper adam;
  adam.lr = 3e-4f;
  adam.beta2 = 0.95f;
  adam.weight_decay = 0.1f;
  adam.decoupled_weight_decay = true;
  adam.set_step(17);
  const AdamHyper back = adam_hyper_with(adam, rates_of(adam));
  CHECK(back.lr == adam.lr);
  CHECK(back.step == 17);
  CHECK(back.step_size == adam.step_size);
  CHECK(back.bias_correction2_sqrt == adam.bias_correction2_sqrt);
  CHECK(back.decay_factor == adam.decay_factor);
  CHECK(back.decay_factor != 1.0f);  // AdamW: the factor is carried, not defaulted

  for (bool first : {false, true}) {
    SgdHyper sgd;
    sgd.lr = 0.125f;
    sgd.momentum = 0.9f;
    sgd.first_step = first;
    const SgdHyper sgd_back = sgd_hyper_with(sgd, rates_of(sgd));
    CHECK(sgd_back.lr == sgd.lr);
    CHECK(sgd_back.first_step == first);
  }
}

TEST_CASE("adam_steps and sgd_steps of no parameters do nothing", "[amp]") {
  const Tensor taken = taken_tensor(0), clear = Tensor::zeros({1});
  CHECK_NOTHROW(cpu_backend().adam_steps({}, nullptr, nullptr));
  CHECK_NOTHROW(cpu_backend().adam_steps({}, &taken, &clear));
  CHECK_NOTHROW(cpu_backend().sgd_steps({}, nullptr, nullptr));
  CHECK_NOTHROW(cpu_backend().sgd_steps({}, &taken, &clear));
  // The call-level rule holds even with nothing to update.
  CHECK_THROWS_WITH(cpu_backend().sgd_steps({}, &taken, nullptr), Catch::Contains("found_inf"));
}

TEST_CASE("adam_steps refuses buffers shared between steps, whichever role they play", "[amp]") {
  // Four parameters of one shape, so that any buffer of one step passes another step's own
  // checks; only the overlap between steps is wrong. One launch would update all at once.
  const int64_t n = 64;
  std::vector<AdamParam> params;
  for (uint32_t i = 0; i < 4; ++i) {
    AdamHyper hyper;
    hyper.set_step(1);
    params.push_back({hyper, normal_tensor(n, DType::F32, 10 + i, 1.0),
                      normal_tensor(n, DType::F32, 20 + i, 0.1), Tensor::zeros({n}),
                      Tensor::zeros({n}), Tensor()});
  }
  std::vector<AdamParamStep> steps;
  for (AdamParam& p : params) steps.push_back(p.step());
  const std::vector<std::vector<uint32_t>> before = [&] {
    std::vector<std::vector<uint32_t>> all;
    for (const AdamParam& p : params) all.push_back(bits_of(p.master));
    return all;
  }();
  SECTION("a gradient that is another step's moment") { steps[3].grad = &params[0].exp_avg; }
  SECTION("a working copy that is another step's master") {
    params[2].working = params[1].master;
    steps[2].working = &params[2].working;
  }
  SECTION("a moment that is a reshaped view of another step's moment") {
    params[3].exp_avg_sq = params[1].exp_avg_sq.reshape({n / 2, 2}).reshape({n});
  }
  const std::string message =
      error_message([&] { cpu_backend().adam_steps(steps, nullptr, nullptr); });
  CHECK_THAT(message, Catch::Contains("adam_steps") && Catch::Contains("share memory"));
  for (size_t i = 0; i < params.size(); ++i) CHECK(bits_of(params[i].master) == before[i]);
}

TEST_CASE("the optimizer steps refuse memory named twice within a step or as the flag",
          "[amp]") {
  const int64_t n = 8;
  AdamHyper hyper;
  hyper.set_step(1);
  Tensor master = normal_tensor(n, DType::F32, 1, 1.0);
  Tensor grad = normal_tensor(n, DType::F32, 2, 0.1);
  Tensor exp_avg = Tensor::zeros({n}), exp_avg_sq = Tensor::zeros({n});
  const std::vector<uint32_t> before = bits_of(master);
  // One buffer in two roles passes each role's own check (F32, the master's shape).
  CHECK_THAT(error_message([&] {
               adam_step_on(cpu_backend(), hyper, master, grad, master, exp_avg_sq, nullptr,
                            nullptr);
             }),
             Catch::Contains("adam_steps: step 0 names the same memory twice"));
  SgdHyper sgd;
  sgd.momentum = 0.9f;
  CHECK_THAT(error_message(
                 [&] { sgd_step_on(cpu_backend(), sgd, master, grad, &grad, nullptr, nullptr); }),
             Catch::Contains("sgd_steps: step 0 names the same memory twice"));
  // Without momentum the buffer is not used, so naming the gradient there is harmless.
  sgd.momentum = 0.0f;
  Tensor sgd_master = master.clone();
  CHECK_NOTHROW(sgd_step_on(cpu_backend(), sgd, sgd_master, grad, &grad, nullptr, nullptr));
  // A flag that is a one-element master.
  Tensor single = Tensor::zeros({1});
  const Tensor single_grad = Tensor::zeros({1});
  CHECK_THAT(error_message([&] {
               sgd_step_on(cpu_backend(), sgd, single, single_grad, nullptr, nullptr, &single);
             }),
             Catch::Contains("sgd_steps: found_inf shares memory with step 0"));

  // In a multi-tensor call the message names the step.
  std::vector<AdamParam> params;
  for (uint32_t i = 0; i < 3; ++i) {
    params.push_back({hyper, normal_tensor(n, DType::F32, 10 + i, 1.0),
                      normal_tensor(n, DType::F32, 20 + i, 0.1), Tensor::zeros({n}),
                      Tensor::zeros({n}), Tensor()});
  }
  std::vector<AdamParamStep> steps;
  for (AdamParam& p : params) steps.push_back(p.step());
  steps[1].exp_avg_sq = steps[1].master;
  CHECK_THAT(error_message([&] { cpu_backend().adam_steps(steps, nullptr, nullptr); }),
             Catch::Contains("adam_steps: step 1 names the same memory twice"));
  steps[1].exp_avg_sq = &params[1].exp_avg_sq;
  // The flag is the gradient of a one-element step.
  AdamParam tiny{hyper, Tensor::zeros({1}), Tensor::zeros({1}), Tensor::zeros({1}),
                 Tensor::zeros({1}), Tensor()};
  steps.push_back(tiny.step());
  CHECK_THAT(error_message([&] { cpu_backend().adam_steps(steps, nullptr, &tiny.grad); }),
             Catch::Contains("adam_steps: found_inf shares memory with step 3"));
  CHECK(bits_of(master) == before);
  for (const AdamParam& p : params) CHECK(bits_of(p.exp_avg) == bits_of(Tensor::zeros({n})));
}

TEST_CASE("adam_steps and sgd_steps of no parameters still check their flag and counter",
          "[amp]") {
  const Tensor taken = taken_tensor(0), clear = Tensor::zeros({1});
  const Tensor int_flag = Tensor::zeros({1}, DType::I32), empty_flag = Tensor::zeros({0});
  const Tensor float_taken = Tensor::zeros({1});
  CHECK_THAT(error_message([&] { cpu_backend().adam_steps({}, nullptr, &int_flag); }),
             Catch::Contains("adam_steps: found_inf must be F32 [1]"));
  CHECK_THAT(error_message([&] { cpu_backend().sgd_steps({}, nullptr, &empty_flag); }),
             Catch::Contains("sgd_steps: found_inf must be F32 [1]"));
  CHECK_THAT(error_message([&] { cpu_backend().adam_steps({}, &float_taken, &clear); }),
             Catch::Contains("adam_steps: taken must be I32 [1]"));
}
