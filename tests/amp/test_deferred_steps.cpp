// DeferredSteps against the regular GradScaler path: the same steps, with overflows injected
// into some of them, give bit-identical weights, optimizer state and the same telemetry once
// resolved, however the steps are grouped between resolves; misuse throws.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "amp/deferred_steps.h"
#include "amp/dynamic_loss_scale.h"
#include "amp/grad_scaler.h"
#include "amp/no_loss_scale.h"
#include "core/error.h"
#include "core/generator.h"
#include "core/ops/ops.h"
#include "optim/adam.h"
#include "optim/clip_grad_norm.h"
#include "optim/lr_schedule.h"
#include "optim/sgd.h"
#include "tests/tensor_bytes.h"

namespace mixprec {
namespace {

using Catch::Matchers::Contains;
using mixprec_test::float_bits;

// y = x W^T + b with an MSE loss, FP16 working copies; `unused` (when asked for) is a
// trainable parameter that the loss never reaches.
struct Model {
  Parameter weight, bias, unused;
  explicit Model(bool with_unused = false) {
    Generator gen(11);
    weight = Parameter("fc.weight", Tensor::normal({3, 4}, gen, 0.f, 0.5f));
    bias = Parameter("fc.bias", Tensor::normal({3}, gen, 0.f, 0.5f));
    weight.set_working_dtype(DType::F16);
    bias.set_working_dtype(DType::F16);
    if (with_unused) unused = Parameter("spare", Tensor::normal({2}, gen));
  }
  std::vector<Parameter> params() const {
    std::vector<Parameter> all{weight, bias};
    if (unused.defined()) all.push_back(unused);
    return all;
  }
  // The loss of step `step` (1-based); times Inf when the step is to overflow.
  Tensor loss(int64_t step, bool overflow) const {
    Generator gen(100 + static_cast<uint64_t>(step));
    const Tensor x = Tensor::normal({6, 4}, gen);
    const Tensor y = Tensor::normal({6, 3}, gen, 0.f, 3.f);
    const Tensor pred = ops::linear(x.to(DType::F16), weight.working(), bias.working());
    const Tensor loss = ops::mse_loss(pred.to(DType::F32), y);
    return overflow ? ops::mul_scalar(loss, std::numeric_limits<double>::infinity()) : loss;
  }
};

std::unique_ptr<LossScalePolicy> growing_scale() {
  DynamicLossScaleOptions options;
  options.init_scale = 1024.0;
  options.growth_interval = 2;  // grows inside a window of pending steps
  options.hysteresis = 2;       // the first overflow after a growth is only tolerated
  return std::make_unique<DynamicLossScale>(options);
}

std::unique_ptr<Optimizer> make_optimizer(const std::string& kind, const Model& model) {
  if (kind == "sgd") {
    SgdOptions options;
    options.lr = 0.05;
    options.momentum = 0.9;
    options.weight_decay = 0.01;
    return std::make_unique<SGD>(model.params(), options);
  }
  AdamOptions options;
  options.lr = 0.01;
  options.weight_decay = 0.1;
  return std::make_unique<AdamW>(model.params(), options);
}

void check_same_telemetry(const StepTelemetry& a, const StepTelemetry& b) {
  CHECK(a.step == b.step);
  CHECK(a.scale == b.scale);
  CHECK(a.next_scale == b.next_scale);
  CHECK(a.scale_event == b.scale_event);
  CHECK(a.found_inf == b.found_inf);
  CHECK(a.skipped == b.skipped);
  CHECK(a.reason == b.reason);
  CHECK(a.nonfinite_tensors == b.nonfinite_tensors);
  CHECK(a.growth_tracker == b.growth_tracker);
  CHECK(a.hysteresis_left == b.hysteresis_left);
  CHECK(a.skipped_in_a_row == b.skipped_in_a_row);
  // The regular path keeps the norm in double, the deferred one reads it back as float.
  if (std::isfinite(a.grad_norm)) {
    CHECK(b.grad_norm == Approx(a.grad_norm).epsilon(1e-6));
  } else {
    CHECK(!std::isfinite(b.grad_norm));
  }
}

void check_same_state(const Model& a, const Model& b, const Optimizer& opt_a,
                      const Optimizer& opt_b, const GradScaler& scaler_a,
                      const GradScaler& scaler_b) {
  CHECK(float_bits(a.weight.master()) == float_bits(b.weight.master()));
  CHECK(float_bits(a.bias.master()) == float_bits(b.bias.master()));
  CHECK(float_bits(a.weight.working()) == float_bits(b.weight.working()));
  CHECK(opt_a.steps_taken() == opt_b.steps_taken());
  CHECK(opt_a.lr() == opt_b.lr());
  CHECK(scaler_a.scale_value() == scaler_b.scale_value());
  CHECK(scaler_a.effective_steps() == scaler_b.effective_steps());
  CHECK(scaler_a.state_dict() == scaler_b.state_dict());
  const OptimizerState state_a = opt_a.state_dict();
  const OptimizerState state_b = opt_b.state_dict();
  CHECK(state_a.scalars == state_b.scalars);
  REQUIRE(state_a.tensors.size() == state_b.tensors.size());
  for (size_t i = 0; i < state_a.tensors.size(); ++i) {
    CHECK(state_a.tensors[i].first == state_b.tensors[i].first);
    CHECK(float_bits(state_a.tensors[i].second) == float_bits(state_b.tensors[i].second));
  }
}

}  // namespace

TEST_CASE("DeferredSteps: resolved steps equal the regular path bit for bit", "[amp][deferred]") {
  const std::string kind = GENERATE(std::string("sgd"), std::string("adamw"));
  // Step 1 overflows (the very first update is skipped: buffers must start at step 2), 4 is
  // tolerated by hysteresis, 5 backs off, 9 is a lone overflow inside a window.
  const std::set<int64_t> overflow{1, 4, 5, 9};
  // When the deferred side resolves; the last step always does.
  const std::set<int64_t> resolve_after = GENERATE(std::set<int64_t>{1, 3, 7, 12},
                                                   std::set<int64_t>{12},
                                                   std::set<int64_t>{2, 4, 5, 6, 9, 10, 12});
  CAPTURE(kind, resolve_after);
  const std::unique_ptr<LrSchedule> schedule = make_warmup_cosine_schedule(0.01, 3, 12, 0.001);

  Model model_a, model_b;
  std::unique_ptr<Optimizer> opt_a = make_optimizer(kind, model_a);
  std::unique_ptr<Optimizer> opt_b = make_optimizer(kind, model_b);
  opt_a->set_lr(schedule->lr_at(0));
  opt_b->set_lr(schedule->lr_at(0));
  GradScaler scaler_a(growing_scale());
  GradScaler scaler_b(growing_scale());
  DeferredSteps deferred(scaler_b, *opt_b);

  std::vector<StepResult> results_a;
  std::vector<StepTelemetry> telemetry_a;
  std::vector<ResolvedStep> resolved_b;
  for (int64_t step = 1; step <= 12; ++step) {
    // The regular loop.
    opt_a->zero_grad();
    scaler_a.scale(model_a.loss(step, overflow.count(step) > 0)).backward();
    scaler_a.unscale(*opt_a);
    scaler_a.record_grad_norm(clip_grad_norm(model_a.params(), 0.5));
    results_a.push_back(scaler_a.step(*opt_a));
    telemetry_a.push_back(scaler_a.update());
    if (results_a.back().stepped()) opt_a->set_lr(schedule->lr_at(opt_a->steps_taken()));

    // The deferred one.
    opt_b->zero_grad();
    deferred.scale(model_b.loss(step, overflow.count(step) > 0)).backward();
    deferred.unscale();
    deferred.clip_grad_norm(model_b.params(), 0.5);
    deferred.step(schedule.get());
    if (resolve_after.count(step) > 0) {
      int64_t taken = 0;
      for (ResolvedStep& r : deferred.resolve()) {
        taken += r.result.stepped() ? 1 : 0;
        resolved_b.push_back(std::move(r));
      }
      if (taken > 0) opt_b->set_lr(schedule->lr_at(opt_b->steps_taken()));
      CHECK(deferred.pending() == 0);
      check_same_state(model_a, model_b, *opt_a, *opt_b, scaler_a, scaler_b);
    } else {
      CHECK(deferred.pending() > 0);
    }
  }
  REQUIRE(resolved_b.size() == results_a.size());
  for (size_t i = 0; i < results_a.size(); ++i) {
    CAPTURE(i + 1);
    CHECK(results_a[i].outcome == resolved_b[i].result.outcome);
    CHECK(results_a[i].reason == resolved_b[i].result.reason);
    CHECK(results_a[i].nonfinite_tensors == resolved_b[i].result.nonfinite_tensors);
    check_same_telemetry(telemetry_a[i], resolved_b[i].telemetry);
  }
  // The scenario exercises what it means to: skips, a tolerated overflow, a backoff, growth.
  std::set<std::string> events;
  for (const StepTelemetry& t : telemetry_a) events.insert(t.scale_event);
  CHECK(events == std::set<std::string>{"kept", "grew", "backed_off", "overflow_tolerated"});
  CHECK(opt_a->steps_taken() == 8);
}

TEST_CASE("DeferredSteps: a first update skipped on the device leaves no optimizer buffers",
          "[amp][deferred]") {
  const std::string kind = GENERATE(std::string("sgd"), std::string("adamw"));
  CAPTURE(kind);
  Model model;
  std::unique_ptr<Optimizer> opt = make_optimizer(kind, model);
  GradScaler scaler(growing_scale());
  DeferredSteps deferred(scaler, *opt);
  const std::vector<uint32_t> before = float_bits(model.weight.master());
  opt->zero_grad();
  deferred.scale(model.loss(1, true)).backward();
  deferred.unscale();
  deferred.step(nullptr);
  const std::vector<ResolvedStep> resolved = deferred.resolve();
  REQUIRE(resolved.size() == 1);
  CHECK(resolved[0].result.skipped());
  CHECK(resolved[0].result.nonfinite_tensors == std::vector<std::string>{"fc.weight", "fc.bias"});
  CHECK(float_bits(model.weight.master()) == before);
  CHECK(opt->steps_taken() == 0);
  // A never-updated parameter has no buffers, as after a skip on the regular path.
  CHECK(opt->state_dict().tensors.empty());
}

TEST_CASE("DeferredSteps: out-of-order calls and unsupported steps throw", "[amp][deferred]") {
  Model model(true);
  std::unique_ptr<Optimizer> opt = make_optimizer("adamw", model);
  GradScaler scaler(growing_scale());
  DeferredSteps deferred(scaler, *opt);

  CHECK_THROWS_WITH(deferred.unscale(), Contains("between steps"));
  CHECK_THROWS_WITH(deferred.step(nullptr), Contains("between steps"));
  CHECK_THROWS_WITH(deferred.scale(model.loss(1, false), 0.0), Contains("weight"));

  // "spare" never gets a gradient: the deferred step refuses before writing anything.
  const std::vector<uint32_t> before = float_bits(model.weight.master());
  opt->zero_grad();
  deferred.scale(model.loss(1, false)).backward();
  CHECK_THROWS_WITH(deferred.resolve(), Contains("after scale()"));
  deferred.unscale();
  CHECK_THROWS_WITH(deferred.scale(model.loss(1, false)), Contains("already unscaled"));
  CHECK_THROWS_WITH(deferred.step(nullptr), Contains("'spare' has no gradient"));
  CHECK_FALSE(opt->unsettled());
  CHECK(float_bits(model.weight.master()) == before);

  // Frozen, it is left alone and the step goes through.
  model.unused.set_requires_grad(false);
  deferred.step(nullptr);
  CHECK(opt->unsettled());
  CHECK_THROWS_WITH(opt->step(), Contains("not yet settled"));
  CHECK_THROWS_WITH(opt->state_dict(), Contains("not yet settled"));
  CHECK(deferred.resolve().size() == 1);
  CHECK(opt->steps_taken() == 1);
  CHECK(float_bits(model.weight.master()) != before);
}

TEST_CASE("DeferredSteps: at most kMaxDeferredSteps steps wait for a resolve",
          "[amp][deferred]") {
  Model model;
  SGD opt(model.params(), SgdOptions{});
  // A scale that stays put, so that no step overflows.
  GradScaler scaler(std::make_unique<DynamicLossScale>(DynamicLossScaleOptions{.init_scale = 256.0}));
  DeferredSteps deferred(scaler, opt);
  for (int64_t step = 1; step <= kMaxDeferredSteps; ++step) {
    opt.zero_grad();
    deferred.scale(model.loss(step, false)).backward();
    deferred.unscale();
    deferred.step(nullptr);
  }
  CHECK(deferred.full());
  CHECK_THROWS_WITH(deferred.scale(model.loss(0, false)), Contains("call resolve() first"));
  const std::vector<ResolvedStep> resolved = deferred.resolve();
  CHECK(resolved.size() == static_cast<size_t>(kMaxDeferredSteps));
  CHECK(opt.steps_taken() == kMaxDeferredSteps);
  CHECK_FALSE(deferred.full());
}

}  // namespace mixprec

namespace mixprec {
namespace {

// Two microbatches of one step, weighted 1/3 and 2/3, through the regular scaler and through
// DeferredSteps: the same weights afterwards.
void check_weighted_microbatches(std::unique_ptr<LossScalePolicy> policy_a,
                                 std::unique_ptr<LossScalePolicy> policy_b, bool enabled) {
  Model model_a, model_b;
  SGD opt_a(model_a.params(), SgdOptions{.lr = 0.1});
  SGD opt_b(model_b.params(), SgdOptions{.lr = 0.1});
  GradScaler scaler_a(std::move(policy_a), enabled);
  GradScaler scaler_b(std::move(policy_b), enabled);
  DeferredSteps deferred(scaler_b, opt_b);
  for (int64_t step = 1; step <= 2; ++step) {
    opt_a.zero_grad();
    opt_b.zero_grad();
    scaler_a.begin_accumulation(3);
    scaler_a.scale(model_a.loss(step, false), 1).backward();
    scaler_a.scale(model_a.loss(step + 10, false), 2).backward();
    scaler_a.step(opt_a);
    scaler_a.update();
    deferred.scale(model_b.loss(step, false), 1.0 / 3.0).backward();
    deferred.scale(model_b.loss(step + 10, false), 2.0 / 3.0).backward();
    deferred.unscale();
    deferred.step(nullptr);
  }
  CHECK(deferred.resolve().size() == 2);
  CHECK(float_bits(model_a.weight.master()) == float_bits(model_b.weight.master()));
  CHECK(float_bits(model_a.bias.master()) == float_bits(model_b.bias.master()));
}

}  // namespace

TEST_CASE("DeferredSteps: microbatch weights apply with and without a loss scale",
          "[amp][deferred]") {
  SECTION("dynamic scale") { check_weighted_microbatches(growing_scale(), growing_scale(), true); }
  SECTION("no loss scale") {
    check_weighted_microbatches(std::make_unique<NoLossScale>(), std::make_unique<NoLossScale>(),
                                true);
  }
  SECTION("disabled scaler") {
    check_weighted_microbatches(growing_scale(), growing_scale(), false);
  }
}

TEST_CASE("DeferredSteps: freezing a parameter while steps are pending throws",
          "[amp][deferred]") {
  Model model(true);
  model.unused.set_requires_grad(false);
  std::unique_ptr<Optimizer> opt = make_optimizer("adamw", model);
  GradScaler scaler(growing_scale());
  DeferredSteps deferred(scaler, *opt);
  opt->zero_grad();
  deferred.scale(model.loss(1, false)).backward();
  deferred.unscale();
  deferred.step(nullptr);
  model.bias.set_requires_grad(false);
  opt->zero_grad();
  deferred.scale(model.loss(2, false)).backward();
  deferred.unscale();
  CHECK_THROWS_WITH(deferred.step(nullptr),
                    Contains("'fc.bias' was frozen while gated steps are not yet settled"));
  CHECK(opt->unsettled());
}

TEST_CASE("DeferredSteps: an overflow at the floor under floor_policy error fails the resolve "
          "once and for all", "[amp][deferred]") {
  Model model;
  SGD opt(model.params(), SgdOptions{});
  DynamicLossScaleOptions options;
  options.init_scale = 2.0;
  options.min_scale = 1.0;
  options.floor_policy = FloorPolicy::Error;
  GradScaler scaler(std::make_unique<DynamicLossScale>(options));
  DeferredSteps deferred(scaler, opt);
  // 2 -> backs off to 1 -> at the floor: the second overflow is the error.
  for (int64_t step = 1; step <= 3; ++step) {
    opt.zero_grad();
    deferred.scale(model.loss(step, step <= 2)).backward();
    deferred.unscale();
    deferred.step(nullptr);
  }
  CHECK_THROWS_WITH(deferred.resolve(), Contains("pending step 2 of 3") &&
                                            Contains("floor_policy: error"));
  CHECK(scaler.effective_steps() == 1);
  CHECK_THROWS_WITH(deferred.resolve(), Contains("an earlier resolve() failed"));
  CHECK_THROWS_WITH(deferred.scale(model.loss(4, false)), Contains("an earlier resolve() failed"));
}

}  // namespace mixprec
