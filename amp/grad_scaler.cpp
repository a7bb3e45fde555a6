#include "amp/grad_scaler.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <spdlog/spdlog.h>

#include "core/backend.h"
#include "core/error.h"
#include "core/ops/ops.h"

namespace mixprec {
namespace {

std::string join(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& name : names) text += (text.empty() ? "" : ", ") + name;
  return text;
}

std::string label(const Optimizer& optimizer) { return "optimizer '" + optimizer.name() + "'"; }

// A gradient may only be unscaled by the scale it carries: anything else is a gradient that
// was never scaled (backward from the bare loss) or one left over from another step.
void check_grad_carries(const Parameter& param, double scale) {
  const Tensor& working = param.working();
  // Zeros from zero_grad() that no backward reached this step are zeros at any scale.
  if (working.grad_zeroed()) return;
  const double carried = working.grad_scale();
  if (carried == scale) return;
  if (carried == 1.0)
    MIXPREC_FAIL("GradScaler: the gradient of '", param.name(), "' was never scaled (it is at "
                 "true scale) but this step's loss scale is ", scale, ". Run backward from "
                 "scaler.scale(loss), not from the loss itself; an op applied after scale() "
                 "(e.g. scaler.scale(loss) / 2) drops the scale's tag, so call scale() last");
  MIXPREC_FAIL("GradScaler: the gradient of '", param.name(), "' carries loss scale ", carried,
               " but this step's loss scale is ", scale, ". Zero the gradients after each "
               "scaler.update() (optimizer.zero_grad()) so that no step mixes scales");
}

// The version of a tensor's data: in-place writers bump it (Tensor::mark_modified).
uint64_t data_version(const Tensor& t) { return t.impl()->storage->version(); }

// The parameters of `optimizer` that hold a gradient, in the optimizer's order.
std::vector<const Parameter*> params_with_grad(const Optimizer& optimizer) {
  std::vector<const Parameter*> owners;
  for (const Parameter& param : optimizer.params())
    if (param.grad().defined()) owners.push_back(&param);
  return owners;
}

struct CheckOutcome {
  bool found_inf = false;
  std::vector<std::string> nonfinite_tensors;
};

// One fused unscale-and-check pass over the gradients of `owners` (inv_scale 1: check only).
// The host reads the per-tensor flags here, one copy that also tells whether any was set
// (found_inf stays on the device); on the CPU this costs nothing.
CheckOutcome check_grads(const Optimizer& optimizer, const std::vector<const Parameter*>& owners,
                         double inv_scale) {
  std::vector<Tensor> grads;
  for (const Parameter* param : owners) {
    grads.push_back(param->grad());
    MIXPREC_CHECK(grads.back().device() == grads.front().device(), "GradScaler: ",
                  label(optimizer), " has gradients on ", grads.front().device(), " and on ",
                  grads.back().device(), "; one optimizer's parameters must share a device");
  }
  const Device device = grads.front().device();
  Tensor found_inf = Tensor::zeros({1}, DType::F32, device);
  Tensor flags = Tensor::empty({static_cast<int64_t>(grads.size())}, DType::I32, device);
  backend_for(device).unscale_and_check(grads, inv_scale, found_inf, flags);
  CheckOutcome outcome;
  const std::vector<int32_t> nonfinite = flags.to_int_vector();
  for (size_t i = 0; i < nonfinite.size(); ++i)
    if (nonfinite[i] != 0) outcome.nonfinite_tensors.push_back(owners[i]->name());
  outcome.found_inf = !outcome.nonfinite_tensors.empty();
  return outcome;
}

// The diagnostic for an overflow at min_scale: the tensors that overflowed in the current run
// of skipped steps, most frequent first.
std::string floor_message(double min_scale, int64_t steps_in_a_row,
                          const std::map<std::string, int64_t>& overflow_counts) {
  std::vector<std::pair<int64_t, std::string>> ranked;
  for (const auto& [name, count] : overflow_counts) ranked.emplace_back(-count, name);
  std::sort(ranked.begin(), ranked.end());
  std::string culprits;
  for (const auto& [negative_count, name] : ranked)
    culprits += (culprits.empty() ? "" : ", ") + name + " (" + std::to_string(-negative_count) +
                "x)";
  return spdlog::fmt_lib::format(
      "loss scale is at its floor (min_scale {}) and gradients still overflow: {} overflowing "
      "step(s) in a row; non-finite tensors: {}. Lowering the scale cannot help any more: "
      "look for Inf/NaN in the data or the forward pass, or lower the learning rate",
      min_scale, steps_in_a_row, culprits.empty() ? "(none named)" : culprits);
}

}  // namespace

GradScaler::GradScaler(std::unique_ptr<LossScalePolicy> policy, bool enabled)
    : policy_(std::move(policy)), enabled_(enabled) {
  MIXPREC_CHECK(policy_ != nullptr, "GradScaler: needs a loss-scale policy (use NoLossScale for "
                "none)");
}

double GradScaler::scale_value() const {
  return enabled_ && policy_->scales_loss() ? policy_->scale() : 1.0;
}

GradScaler::OptimizerRecord& GradScaler::record_for(Optimizer& optimizer) {
  return records_[&optimizer];
}

Tensor GradScaler::scaled_loss(const Tensor& loss, double weight) {
  MIXPREC_CHECK(loss.defined() && is_floating(loss.dtype()), "GradScaler::scale: the loss must "
                "be a defined floating tensor, got ", loss.defined() ? describe(loss) : "undefined");
  for (const auto& [optimizer, record] : records_)
    MIXPREC_CHECK(record.stage == Stage::Ready, "GradScaler::scale: ", label(*optimizer),
                  " was already unscaled or stepped in this step; call scaler.update() before "
                  "scaling the next step's loss");
  const double scale = scale_value();
  // The multiply happens in FP32 whatever the loss dtype: S times a 16-bit loss could
  // overflow FP16 before backward even starts.
  const Tensor wide = loss.to(DType::F32);
  const double factor = scale * weight;
  Tensor scaled = factor == 1.0 ? wide : ops::mul_scalar(wide, factor);
  if (scale != 1.0) {
    if (scaled.is_same(loss)) scaled = ops::mul_scalar(wide, 1.0);  // never retag the caller's loss
    scaled.set_loss_scale(scale);
  }
  scaled_this_step_ = true;
  step_scale_ = scale;
  return scaled;
}

Tensor GradScaler::scale(const Tensor& loss) {
  MIXPREC_CHECK(!in_accumulation_window(), "GradScaler::scale: inside an accumulation window of ",
                window_total_, " samples; pass the microbatch's sample count: scale(loss, samples)");
  return scaled_loss(loss, 1.0);
}

Tensor GradScaler::scale(const Tensor& loss, int64_t samples) {
  MIXPREC_CHECK(in_accumulation_window(), "GradScaler::scale(loss, samples): no accumulation "
                "window is open; call begin_accumulation(total_samples) first, or scale(loss) "
                "for a whole batch");
  MIXPREC_CHECK(samples >= 1, "GradScaler::scale: a microbatch needs at least 1 sample, got ",
                samples);
  MIXPREC_CHECK(window_seen_ + samples <= window_total_, "GradScaler::scale: this microbatch's ",
                samples, " samples would take the window to ", window_seen_ + samples, " of ",
                window_total_, "; the microbatch sizes must add up to begin_accumulation's total");
  // Each microbatch loss is a mean over its own samples; weighting by its share of the
  // effective batch makes the accumulated gradient the mean over all of them.
  Tensor scaled = scaled_loss(loss, static_cast<double>(samples) / static_cast<double>(window_total_));
  window_seen_ += samples;
  return scaled;
}

void GradScaler::begin_accumulation(int64_t total_samples) {
  MIXPREC_CHECK(total_samples >= 1, "GradScaler::begin_accumulation: total_samples must be >= 1, "
                "got ", total_samples);
  MIXPREC_CHECK(!in_accumulation_window(), "GradScaler::begin_accumulation: a window of ",
                window_total_, " samples is already open (", window_seen_, " scaled); finish it "
                "with step() and update() first");
  MIXPREC_CHECK(!scaled_this_step_, "GradScaler::begin_accumulation: scale() already ran in this "
                "step outside a window; call update() first");
  for (const auto& [optimizer, record] : records_)
    MIXPREC_CHECK(record.stage == Stage::Ready, "GradScaler::begin_accumulation: ",
                  label(*optimizer), " was already unscaled or stepped in this step; call "
                  "update() first");
  window_total_ = total_samples;
  window_seen_ = 0;
}

void GradScaler::require_window_complete(const char* call) const {
  MIXPREC_CHECK(!in_accumulation_window() || window_seen_ == window_total_, "GradScaler::", call,
                ": inside the accumulation window (", window_seen_, " of ", window_total_,
                " samples scaled so far). Call it once, after the last microbatch's backward: "
                "earlier would mix gradients at different scales in the same buffers");
}

void GradScaler::unscale_record(Optimizer& optimizer, OptimizerRecord& record) {
  const bool scaling = policy_->scales_loss();
  MIXPREC_CHECK(scaled_this_step_ || !scaling, "GradScaler: the gradients of ", label(optimizer),
                " were never scaled in this step: run backward from scaler.scale(loss) before "
                "unscale() or step()");
  const double scale = scaled_this_step_ ? step_scale_ : scale_value();
  const std::vector<const Parameter*> owners = params_with_grad(optimizer);
  MIXPREC_CHECK(!owners.empty(), "GradScaler: ", label(optimizer), " has no gradients in this "
                "step, so there is nothing to check or unscale: run backward from "
                "scaler.scale(loss) before unscale() or step()");
  for (const Parameter* param : owners) check_grad_carries(*param, scale);
  const CheckOutcome outcome = check_grads(optimizer, owners, 1.0 / scale);
  record.checked.clear();
  for (const Parameter* param : owners) {
    Tensor grad = param->grad();
    grad.mark_modified();
    param->working().set_grad_scale(1.0);
    record.checked.push_back({grad, data_version(grad)});
  }
  record.found_inf = outcome.found_inf;
  record.nonfinite_tensors = outcome.nonfinite_tensors;
  record.stage = Stage::Unscaled;
}

bool GradScaler::changed_since_unscale(const Optimizer& optimizer, const OptimizerRecord& record) {
  const std::vector<const Parameter*> owners = params_with_grad(optimizer);
  if (owners.size() != record.checked.size()) return true;
  for (size_t k = 0; k < owners.size(); ++k) {
    const Tensor grad = owners[k]->grad();
    if (!record.checked[k].grad.is_same(grad) || record.checked[k].version != data_version(grad))
      return true;
  }
  return false;
}

void GradScaler::recheck(Optimizer& optimizer, OptimizerRecord& record) {
  const std::vector<const Parameter*> owners = params_with_grad(optimizer);
  for (const Parameter* param : owners)
    MIXPREC_CHECK(param->working().grad_scale() == 1.0 || param->working().grad_zeroed(),
                  "GradScaler::step: the gradient of '", param->name(), "' changed after "
                  "unscale() and now carries loss scale ", param->working().grad_scale(),
                  "; run every backward of the step before unscale()");
  if (owners.empty()) return;
  const CheckOutcome outcome = check_grads(optimizer, owners, 1.0);
  record.found_inf = record.found_inf || outcome.found_inf;
  if (outcome.found_inf) record.nonfinite_tensors = outcome.nonfinite_tensors;
}

void GradScaler::unscale(Optimizer& optimizer) {
  if (!enabled_) return;
  require_window_complete("unscale");
  OptimizerRecord& record = record_for(optimizer);
  MIXPREC_CHECK(record.stage != Stage::Unscaled, "GradScaler::unscale: ", label(optimizer),
                " was already unscaled in this step and its gradients are at true scale. Call "
                "unscale() once per optimizer per step (before clipping), then step() and "
                "update()");
  MIXPREC_CHECK(record.stage != Stage::Stepped, "GradScaler::unscale: ", label(optimizer),
                " already stepped in this step. Call update() to finish the step; unscale() "
                "belongs between backward and step()");
  unscale_record(optimizer, record);
}

StepResult GradScaler::step(Optimizer& optimizer) {
  StepResult result;
  if (!enabled_) {
    optimizer.step();
    return result;
  }
  require_window_complete("step");
  OptimizerRecord& record = record_for(optimizer);
  MIXPREC_CHECK(record.stage != Stage::Stepped, "GradScaler::step: ", label(optimizer),
                " already stepped in this step. Call update() before the next step");
  if (record.stage == Stage::Ready) {
    unscale_record(optimizer, record);
  } else if (changed_since_unscale(optimizer, record)) {
    // Clipping, or a backward after unscale(): check again what the optimizer will read.
    recheck(optimizer, record);
  }
  if (record.found_inf) {
    result = skip_result(optimizer, record.nonfinite_tensors, step_scale_);
    record.skipped = true;
    record.stage = Stage::Stepped;
    return result;
  }
  record.stage = Stage::Stepped;
  try {
    optimizer.step();
  } catch (const std::exception& e) {
    record.failure = e.what();
    throw;
  }
  return result;
}

void GradScaler::record_grad_norm(double norm) { grad_norm_ = norm; }

StepTelemetry GradScaler::update() {
  StepTelemetry telemetry;
  telemetry.step = effective_steps_;
  if (!enabled_) {
    telemetry.scale = 1.0;
    telemetry.grad_norm = grad_norm_;
    return close_step(std::move(telemetry));
  }
  require_window_complete("update");
  const bool checked = std::any_of(records_.begin(), records_.end(),
                                   [](const auto& entry) { return entry.second.stage != Stage::Ready; });
  MIXPREC_CHECK(checked, "GradScaler::update: no optimizer was unscaled or stepped since the last "
                "update, so there is no Inf/NaN check to act on. Call scaler.step(optimizer) "
                "for each optimizer first");
  for (const auto& [optimizer, record] : records_) {
    if (record.failure.empty()) continue;
    const std::string failure = label(*optimizer) + "'s step failed (" + record.failure + ")";
    abandon_step();
    MIXPREC_FAIL("GradScaler::update: ", failure, "; the scale was not moved and the step was "
                 "not counted. Zero the gradients and start the next step");
  }

  for (const auto& [optimizer, record] : records_) {
    telemetry.found_inf = telemetry.found_inf || record.found_inf;
    telemetry.skipped = telemetry.skipped || record.skipped;
    telemetry.nonfinite_tensors.insert(telemetry.nonfinite_tensors.end(),
                                       record.nonfinite_tensors.begin(),
                                       record.nonfinite_tensors.end());
  }
  telemetry.scale = scaled_this_step_ ? step_scale_ : scale_value();
  telemetry.grad_norm = grad_norm_;
  return close_step(std::move(telemetry));
}

StepTelemetry GradScaler::close_step(StepTelemetry telemetry) {
  if (!enabled_) {  // nothing was checked and the scale stays 1
    telemetry.next_scale = 1.0;
    telemetry.scale_event = scale_event_name(ScaleEvent::Kept);
    finish_step();
    return telemetry;
  }
  if (telemetry.skipped)
    telemetry.reason = "non-finite gradients at loss scale " +
                       spdlog::fmt_lib::format("{}", scale_value()) + ": " +
                       join(telemetry.nonfinite_tensors);

  std::map<std::string, int64_t> overflow_counts = telemetry.found_inf ? overflow_counts_
                                                                        : std::map<std::string, int64_t>{};
  for (const std::string& name : telemetry.nonfinite_tensors) ++overflow_counts[name];

  // Only an overflow can hit the floor, so only then is the policy kept for a rollback.
  std::unique_ptr<LossScalePolicy> before = telemetry.found_inf ? policy_->clone() : nullptr;
  const ScaleChange change = policy_->update(telemetry.found_inf);
  if (change.event == ScaleEvent::OverflowAtFloor && policy_->floor_policy() != FloorPolicy::Clamp) {
    const std::string message = floor_message(change.after, skipped_in_a_row_ + 1, overflow_counts);
    if (policy_->floor_policy() == FloorPolicy::Error) {
      policy_ = std::move(before);  // the step is not counted: state stays as it was
      MIXPREC_FAIL("GradScaler::update: ", message, " (floor_policy: error)");
    }
    spdlog::warn("{}", message);
  }
  overflow_counts_ = std::move(overflow_counts);
  skipped_in_a_row_ = telemetry.skipped ? skipped_in_a_row_ + 1 : 0;

  telemetry.next_scale = change.after;
  telemetry.scale_event = scale_event_name(change.event);
  telemetry.growth_tracker = policy_->growth_tracker();
  telemetry.hysteresis_left = policy_->hysteresis_left();
  telemetry.skipped_in_a_row = skipped_in_a_row_;
  finish_step();
  return telemetry;
}

StepResult GradScaler::skip_result(const Optimizer& optimizer,
                                   const std::vector<std::string>& nonfinite, double scale) {
  StepResult result;
  result.outcome = StepResult::Outcome::Skipped;
  result.nonfinite_tensors = nonfinite;
  result.reason = "non-finite gradients in " + std::to_string(nonfinite.size()) + " tensor(s) of " +
                  label(optimizer) + " at loss scale " + spdlog::fmt_lib::format("{}", scale) +
                  ": " + join(nonfinite);
  return result;
}

GradScaler::DeferredOutcome GradScaler::finish_deferred_step(
    const Optimizer& optimizer, const std::vector<std::string>& nonfinite, double grad_norm) {
  for (const auto& [owner, record] : records_)
    MIXPREC_CHECK(record.stage == Stage::Ready, "GradScaler: a deferred step was resolved while ",
                  label(*owner), " is in the middle of a regular step");
  DeferredOutcome outcome;
  const bool found_inf = enabled_ && !nonfinite.empty();
  if (found_inf) outcome.result = skip_result(optimizer, nonfinite, scale_value());
  StepTelemetry telemetry;
  telemetry.step = effective_steps_;
  telemetry.scale = scale_value();
  telemetry.grad_norm = grad_norm;
  telemetry.found_inf = telemetry.skipped = found_inf;
  if (found_inf) telemetry.nonfinite_tensors = nonfinite;
  outcome.telemetry = close_step(std::move(telemetry));
  return outcome;
}

void GradScaler::abandon_step() {
  records_.clear();
  scaled_this_step_ = false;
  window_total_ = window_seen_ = 0;
  grad_norm_ = -1.0;
}

void GradScaler::finish_step() {
  abandon_step();
  ++effective_steps_;
}

nlohmann::json GradScaler::state_dict() const {
  for (const auto& [optimizer, record] : records_)
    MIXPREC_CHECK(record.stage == Stage::Ready, "GradScaler::state_dict: ", label(*optimizer),
                  " is in the middle of a step; save the state after update()");
  MIXPREC_CHECK(!in_accumulation_window() && !scaled_this_step_, "GradScaler::state_dict: a step "
                "is in progress; save the state after update()");
  return {{"enabled", enabled_},
          {"effective_steps", effective_steps_},
          {"skipped_in_a_row", skipped_in_a_row_},
          {"overflow_counts", overflow_counts_},
          {"policy", policy_->state_dict()}};
}

void GradScaler::load_state_dict(const nlohmann::json& state) {
  auto field = [&](const char* key) -> const nlohmann::json& {
    MIXPREC_CHECK(state.is_object() && state.contains(key), "GradScaler::load_state_dict: missing "
                  "field '", key, "'");
    return state.at(key);
  };
  const nlohmann::json& enabled = field("enabled");
  const nlohmann::json& steps = field("effective_steps");
  const nlohmann::json& in_a_row = field("skipped_in_a_row");
  const nlohmann::json& counts = field("overflow_counts");
  const nlohmann::json& policy = field("policy");
  MIXPREC_CHECK(enabled.is_boolean(), "GradScaler::load_state_dict: 'enabled' must be a boolean");
  MIXPREC_CHECK(steps.is_number_integer() && steps.get<int64_t>() >= 0,
                "GradScaler::load_state_dict: 'effective_steps' must be an integer >= 0");
  MIXPREC_CHECK(in_a_row.is_number_integer() && in_a_row.get<int64_t>() >= 0,
                "GradScaler::load_state_dict: 'skipped_in_a_row' must be an integer >= 0");
  MIXPREC_CHECK(counts.is_object(), "GradScaler::load_state_dict: 'overflow_counts' must be an "
                "object of tensor name -> count");
  std::map<std::string, int64_t> overflow_counts;
  for (const auto& [name, count] : counts.items()) {
    MIXPREC_CHECK(count.is_number_integer() && count.get<int64_t>() >= 1, "GradScaler::"
                  "load_state_dict: 'overflow_counts' entry '", name, "' must be an integer >= 1");
    overflow_counts[name] = count.get<int64_t>();
  }
  MIXPREC_CHECK(enabled.get<bool>() == enabled_, "GradScaler::load_state_dict: the state is from a "
                "scaler with enabled=", enabled.get<bool>(), " but this one has enabled=", enabled_);
  const bool kind_is_text = policy.is_object() && policy.contains("kind") &&
                           policy.at("kind").is_string();
  const std::string kind = kind_is_text ? policy.at("kind").get<std::string>() : "?";
  MIXPREC_CHECK(kind == policy_->kind(), "GradScaler::load_state_dict: the state's policy is '",
                kind, "' but this scaler's is '", policy_->kind(), "'");
  for (const auto& [optimizer, record] : records_)
    MIXPREC_CHECK(record.stage == Stage::Ready, "GradScaler::load_state_dict: ", label(*optimizer),
                  " is in the middle of a step; load the state before the step starts");
  MIXPREC_CHECK(!in_accumulation_window() && !scaled_this_step_, "GradScaler::load_state_dict: "
                "a step is in progress (a loss was already scaled); load the state before the "
                "step starts");
  policy_->load_state_dict(policy);  // validates fully and leaves the policy unchanged on error
  effective_steps_ = steps.get<int64_t>();
  skipped_in_a_row_ = in_a_row.get<int64_t>();
  overflow_counts_ = std::move(overflow_counts);
}

}  // namespace mixprec
