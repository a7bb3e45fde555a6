#include "amp/deferred_steps.h"

#include <cstring>
#include <utility>

#include "core/autograd/grad_mode.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/ops/ops.h"
#include "optim/clip_grad_norm.h"

namespace mixprec {
namespace {

// The scale state as Backend::update_loss_scale keeps it, for a policy's current values.
Tensor scale_state_on(Device device, const LossScalePolicy& policy, double scale) {
  DynamicScaleState state;
  state.scale = scale;
  state.growth_tracker = policy.growth_tracker();
  state.hysteresis_left = policy.hysteresis_left();
  std::vector<int32_t> words(kDynamicScaleStateWords);
  std::memcpy(words.data(), &state, sizeof state);
  return Tensor::from_ints(words, {kDynamicScaleStateWords}, device);
}

// One host read for several tensors of one dtype: they are joined on the device first.
Tensor joined(const std::vector<Tensor>& parts) {
  std::vector<Tensor> flat;
  for (const Tensor& part : parts) flat.push_back(ops::reshape(part, {part.numel()}));
  return flat.size() == 1 ? flat.front() : ops::concat(flat, 0);
}

}  // namespace

DeferredSteps::DeferredSteps(GradScaler& scaler, Optimizer& optimizer)
    : scaler_(scaler), optimizer_(optimizer), device_(optimizer.params().front().device()) {
  MIXPREC_CHECK(!scaler.in_accumulation_window(), "DeferredSteps: the scaler is inside an "
                "accumulation window; start deferred steps between steps");
  MIXPREC_CHECK(!optimizer.unsettled(), "DeferredSteps: optimizer '", optimizer.name(),
                "' has gated steps that are not yet settled");
  // A disabled scaler never scales nor checks; its state only needs S = 1.
  const bool scales = scaler.enabled() && scaler.policy().scales_loss();
  if (scales) rule_ = scaler.policy().device_rule();
  scale_state_ = scale_state_on(device_, scaler.policy(), scales ? scaler.scale_value() : 1.0);
  expected_ = scaler.policy().clone();
  taken_ = Tensor::zeros({1}, DType::I32, device_);
}

void DeferredSteps::require_stage(Stage stage, const char* call) const {
  static const char* const kNames[] = {"between steps", "after scale()", "after unscale()"};
  MIXPREC_CHECK(stage_ == stage, "DeferredSteps::", call, ": called ",
                kNames[static_cast<int>(stage_)], "; the order is scale (once per microbatch), "
                "unscale, clip_grad_norm (optional), step");
}

Tensor DeferredSteps::scale(const Tensor& loss, double weight) {
  MIXPREC_CHECK(stage_ == Stage::Ready || stage_ == Stage::Scaled, "DeferredSteps::scale: the "
                "step was already unscaled; call step() before scaling the next loss");
  MIXPREC_CHECK(!full(), "DeferredSteps::scale: ", pending(), " steps are pending, the most "
                "that can be; call resolve() first");
  MIXPREC_CHECK(weight > 0.0 && weight <= 1.0, "DeferredSteps::scale: weight must be in (0, 1], "
                "got ", weight);
  MIXPREC_CHECK(loss.defined() && is_floating(loss.dtype()) && loss.numel() == 1,
                "DeferredSteps::scale: the loss must be a floating scalar, got ",
                loss.defined() ? describe(loss) : "undefined");
  require_usable();
  stage_ = Stage::Scaled;
  const Tensor wide = loss.to(DType::F32);
  // Without a scale the factor is the weight alone, multiplied as GradScaler does it.
  if (!scaler_.enabled() || !scaler_.policy().scales_loss())
    return weight == 1.0 ? wide : ops::mul_scalar(wide, weight);
  Tensor factor = Tensor::empty({1}, DType::F32, device_);
  backend_for(device_).loss_scale_factor(scale_state_, weight, factor);
  // The same float factor the regular path multiplies by (S * weight rounded once), so the
  // gradients have the same bits; only its value stays on the device.
  Tensor scaled = ops::mul(wide, ops::reshape(factor, loss.shape()));
  const double expected = expected_->scale();
  if (expected != 1.0) scaled.set_loss_scale(expected);
  return scaled;
}

void DeferredSteps::unscale() {
  require_usable();
  require_stage(Stage::Scaled, "unscale");
  std::vector<Tensor> grads;
  current_ = PendingStep{};
  for (const Parameter& param : optimizer_.params()) {
    if (!param.grad().defined()) continue;
    grads.push_back(param.grad());
    current_.names.push_back(param.name());
  }
  MIXPREC_CHECK(!grads.empty(), "DeferredSteps::unscale: optimizer '", optimizer_.name(),
                "' has no gradients in this step; run backward from scale(loss) first");
  found_inf_ = Tensor::zeros({1}, DType::F32, device_);
  if (scaler_.enabled()) {
    current_.flags = Tensor::empty({static_cast<int64_t>(grads.size())}, DType::I32, device_);
    backend_for(device_).unscale_and_check_on_device(grads, scale_state_, found_inf_,
                                                     current_.flags);
    found_inf_.mark_modified();
    current_.flags.mark_modified();
  }
  for (const Parameter& param : optimizer_.params()) {
    if (!param.grad().defined()) continue;
    Tensor grad = param.grad();
    grad.mark_modified();
    param.working().set_grad_scale(1.0);
  }
  stage_ = Stage::Unscaled;
}

void DeferredSteps::clip_grad_norm(const std::vector<Parameter>& params, double max_norm) {
  require_stage(Stage::Unscaled, "clip_grad_norm");
  MIXPREC_CHECK(!current_.norm.defined(), "DeferredSteps::clip_grad_norm: this step was already "
                "clipped");
  current_.norm = clip_grad_norm_on_device(params, max_norm);
}

void DeferredSteps::step(const LrSchedule* schedule) {
  require_usable();
  require_stage(Stage::Unscaled, "step");
  // A rate for every count of taken steps a window between two resolves can reach, not only
  // for this step's: the rates then depend only on the state at the last resolve, so every
  // step of the window uploads the same tables (a captured step's graph replays them).
  std::vector<double> lr_by_taken{optimizer_.lr()};
  for (int64_t j = 1; j < kMaxDeferredSteps; ++j)
    lr_by_taken.push_back(schedule ? schedule->lr_at(optimizer_.steps_taken() + j)
                                   : optimizer_.lr());
  const StepGate gate{found_inf_, taken_, std::move(lr_by_taken)};
  optimizer_.step(&gate);
  // Queued after every update above, which read the count before it moves.
  backend_for(device_).count_taken_step(found_inf_, taken_);
  taken_.mark_modified();
  if (rule_) {
    backend_for(device_).update_loss_scale(*rule_, scale_state_, found_inf_);
    scale_state_.mark_modified();
  }
  expected_->update(false);
  pending_.push_back(std::move(current_));
  current_ = PendingStep{};
  stage_ = Stage::Ready;
}

namespace {

// A copy of a pending step's device results, queued now (undefined stays undefined).
Tensor copied(const Tensor& t) { return t.defined() ? t.clone() : Tensor(); }

}  // namespace

void DeferredSteps::keep_captured_step() {
  require_usable();
  require_stage(Stage::Ready, "keep_captured_step");
  MIXPREC_CHECK(!pending_.empty(), "DeferredSteps::keep_captured_step: no step is pending");
  PendingStep& last = pending_.back();
  captured_ = last;
  last.flags = copied(captured_->flags);
  last.norm = copied(captured_->norm);
}

void DeferredSteps::add_replayed_step() {
  require_usable();
  require_stage(Stage::Ready, "add_replayed_step");
  MIXPREC_CHECK(captured_.has_value(),
                "DeferredSteps::add_replayed_step: no captured step since the last resolve");
  MIXPREC_CHECK(!full(), "DeferredSteps::add_replayed_step: ", pending(),
                " steps are pending, as many as fit; resolve them first");
  expected_->update(false);
  pending_.push_back({copied(captured_->flags), copied(captured_->norm), captured_->names});
}

void DeferredSteps::require_usable() const {
  MIXPREC_CHECK(!failed_, "DeferredSteps: an earlier resolve() failed part-way (", failure_,
                "); the scaler and the optimizer no longer match the device, so this object "
                "takes no more steps");
}

std::vector<ResolvedStep> DeferredSteps::resolve() {
  require_usable();
  require_stage(Stage::Ready, "resolve");
  std::vector<ResolvedStep> resolved;
  if (pending_.empty()) return resolved;
  std::vector<Tensor> flags, norms;
  for (const PendingStep& step : pending_) {
    if (step.flags.defined()) flags.push_back(step.flags);
    if (step.norm.defined()) norms.push_back(step.norm);
  }
  std::vector<int32_t> flag_values;
  std::vector<float> norm_values;
  {
    NoGradGuard no_grad;
    if (!flags.empty()) flag_values = joined(flags).to_int_vector();
    if (!norms.empty()) norm_values = joined(norms).to_float_vector();
  }
  size_t next_flag = 0, next_norm = 0;
  int64_t taken = 0;
  for (const PendingStep& step : pending_) {
    std::vector<std::string> nonfinite;
    if (step.flags.defined()) {
      for (const std::string& name : step.names)
        if (flag_values.at(next_flag++) != 0) nonfinite.push_back(name);
    }
    const double norm = step.norm.defined() ? norm_values.at(next_norm++) : -1.0;
    GradScaler::DeferredOutcome outcome;
    try {
      outcome = scaler_.finish_deferred_step(optimizer_, nonfinite, norm);
    } catch (const std::exception& e) {
      // FloorPolicy::Error: the steps before this one are counted, those after it already
      // ran on the device; nothing can be replayed twice.
      failed_ = true;
      failure_ = e.what();
      MIXPREC_FAIL("DeferredSteps::resolve: pending step ", resolved.size() + 1, " of ",
                   pending_.size(), ": ", e.what());
    }
    if (outcome.result.stepped()) ++taken;
    resolved.push_back({std::move(outcome.result), std::move(outcome.telemetry)});
  }
  optimizer_.settle(taken);
  backend_for(device_).fill(taken_, 0.0);
  taken_.mark_modified();
  pending_.clear();
  captured_.reset();
  expected_ = scaler_.policy().clone();
  return resolved;
}

}  // namespace mixprec
