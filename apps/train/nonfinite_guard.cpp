#include "apps/train/nonfinite_guard.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include <spdlog/spdlog.h>

#include "amp/loss_scale.h"
#include "apps/data/input_scan.h"
#include "apps/train/training_stopped.h"
#include "core/error.h"
#include "core/ops/ops.h"

namespace mixprec {
namespace {

constexpr const char* kLossName = "loss";
constexpr const char* kInputName = "input";

std::string number_text(double value) { return spdlog::fmt_lib::format("{}", value); }

const char* value_name(double value) {
  if (std::isnan(value)) return "nan";
  return value > 0 ? "inf" : "-inf";
}

}  // namespace

NonfiniteGuard::NonfiniteGuard(const TrainConfig& config, const std::vector<Parameter>& params,
                               const BatchSource& data, int64_t total_steps,
                               dist::Communicator* ranks)
    : config_(config), ranks_(ranks != nullptr && ranks->size() > 1 ? ranks : nullptr) {
  const DebugConfig& debug = config.debug;
  if (debug.inject_step < 0) return;
  MIXPREC_CHECK(debug.inject_step <= total_steps, "debug.inject_nonfinite.step is ",
                debug.inject_step, " but the run has only ", total_steps, " steps");
  const int size = ranks != nullptr ? ranks->size() : 1;
  MIXPREC_CHECK(debug.inject_rank < size, "debug.inject_nonfinite.rank is ", debug.inject_rank,
                " but the run has ", size, " rank(s), numbered from 0");
  target_ = injection_target(config, params, data);
  // Checked on every rank, applied on the one named.
  const int rank = ranks != nullptr ? ranks->rank() : 0;
  if (debug.inject_rank >= 0 && debug.inject_rank != rank) target_ = Target::None;
}

NonfiniteGuard::Target NonfiniteGuard::injection_target(const TrainConfig& config,
                                                        const std::vector<Parameter>& params,
                                                        const BatchSource& data) {
  const DebugConfig& debug = config.debug;
  if (debug.inject_tensor == kLossName) return Target::Loss;
  if (debug.inject_tensor == kInputName) {
    const DType dtype = data.eval_batch(0).inputs.dtype();
    MIXPREC_CHECK(is_floating(dtype), "debug.inject_nonfinite.tensor: 'input' needs floating "
                  "inputs (images), but this data set's inputs are ", dtype_name(dtype),
                  " token ids, which cannot hold Inf or NaN; inject into 'loss' or a parameter");
    return Target::Input;
  }
  for (const Parameter& param : params) {
    if (param.name() == debug.inject_tensor) {
      parameter_ = param;
      return Target::Parameter;
    }
  }
  std::string names;
  for (const Parameter& param : params) names += (names.empty() ? "" : ", ") + param.name();
  MIXPREC_FAIL("debug.inject_nonfinite.tensor: no parameter named '", debug.inject_tensor,
               "' (and not 'loss' or 'input'); the model has: ", names);
}

void NonfiniteGuard::resume_from(const GradScaler& scaler, int64_t step) {
  const nlohmann::json state = scaler.state_dict();
  skipped_in_a_row_ = state.at("skipped_in_a_row").get<int64_t>();
  last_applied_step_ = std::max<int64_t>(0, step - skipped_in_a_row_);
  counts_.clear();
  if (skipped_in_a_row_ == 0) return;
  for (const auto& [name, count] : state.at("overflow_counts").items()) {
    counts_.emplace_back(name, count.get<int64_t>());
  }
}

double NonfiniteGuard::injected_value() const {
  return config_.debug.inject_value == "nan" ? std::numeric_limits<double>::quiet_NaN()
                                             : std::numeric_limits<double>::infinity();
}

bool NonfiniteGuard::input_is_bad(int64_t step, const std::vector<Batch>& batches) {
  scan_ = scan_step(step, batches);
  return scan_->bad_batch >= 0;
}

NonfiniteGuard::StepScan NonfiniteGuard::scan_step(int64_t step,
                                                   const std::vector<Batch>& batches) const {
  StepScan scan;
  scan.step = step;
  if (target_ == Target::Input && step == config_.debug.inject_step && !batches.empty()) {
    // Element 0 of the first batch, which begin_step sets, is the first non-finite value.
    scan.bad_batch = batches.front().number;
    scan.found = InputScan{0, injected_value()};
  } else {
    for (const Batch& batch : batches) {
      // A prefetched batch was scanned on the prefetcher's thread, while still on the host;
      // one built by hand is scanned now.
      const InputScan found = batch.input_scan ? *batch.input_scan : scan_inputs(batch.inputs);
      if (found.element < 0) continue;
      scan.bad_batch = batch.number;
      scan.found = found;
      break;
    }
  }
  return ranks_ != nullptr ? agree(scan) : scan;
}

NonfiniteGuard::StepScan NonfiniteGuard::agree(StepScan scan) const {
  // One process would scan the step's batches in their order, which is that of their numbers,
  // and name the first bad one: every rank takes the smallest bad number any rank found.
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  const std::vector<int64_t> numbers = ranks_->all_gather_int(scan.bad_batch >= 0 ? scan.bad_batch
                                                                                   : kNone);
  const std::vector<int64_t> elements = ranks_->all_gather_int(scan.found.element);
  const std::vector<int64_t> kinds = ranks_->all_gather_int(
      std::isnan(scan.found.value) ? 0 : scan.found.value > 0 ? 1 : -1);
  const auto first = std::min_element(numbers.begin(), numbers.end()) - numbers.begin();
  if (numbers[static_cast<size_t>(first)] == kNone) return StepScan{scan.step, -1, {}};
  const double values[] = {-std::numeric_limits<double>::infinity(),
                           std::numeric_limits<double>::quiet_NaN(),
                           std::numeric_limits<double>::infinity()};
  const size_t k = static_cast<size_t>(first);
  return StepScan{scan.step, numbers[k], InputScan{elements[k], values[kinds[k] + 1]}};
}

std::optional<StepResult> NonfiniteGuard::begin_step(int64_t step, std::vector<Batch>& batches) {
  input_skip_ = false;
  bad_batch_ = -1;
  nonfinite_loss_ = false;
  if (target_ == Target::Input && step == config_.debug.inject_step && !batches.empty()) {
    // A copy: the data set may hand out views of data it keeps.
    Batch& first = batches.front();
    Tensor inputs = first.inputs.clone();
    inputs.set(0, injected_value());
    first.inputs = inputs;
    // Element 0 is the first non-finite one by construction, so the scan is known without
    // reading the inputs back (they may be on the device already).
    first.input_scan = InputScan{0, injected_value()};
  }
  // input_is_bad may have scanned these batches already (unchanged since: an injection
  // would have made it answer without scanning).
  const StepScan scan = scan_ && scan_->step == step ? *scan_ : scan_step(step, batches);
  scan_.reset();
  if (scan.bad_batch >= 0) {
    const double value = scan.found.value;
    const int64_t element = scan.found.element;
    input_skip_ = true;
    bad_batch_ = scan.bad_batch;
    StepResult result;
    result.outcome = StepResult::Outcome::Skipped;
    result.reason = "input batch " + std::to_string(scan.bad_batch) +
                    " has a non-finite value (" + value_name(value) + ") at element " +
                    std::to_string(element);
    result.nonfinite_tensors = {kInputName};
    return result;
  }
  return std::nullopt;
}

Tensor NonfiniteGuard::loss(int64_t step, int64_t micro, const Tensor& loss) const {
  if (target_ != Target::Loss || step != config_.debug.inject_step || micro != 0) return loss;
  // A product rather than a sum: d(v * loss) = v * d(loss), so backward carries the value into
  // every gradient, as an overflow in the forward pass would.
  return ops::mul_scalar(loss, injected_value());
}

void NonfiniteGuard::gradients(int64_t step) const {
  if (target_ != Target::Parameter || step != config_.debug.inject_step) return;
  Tensor grad = parameter_.grad();
  MIXPREC_CHECK(grad.defined(), "debug.inject_nonfinite: parameter '", config_.debug.inject_tensor,
                "' has no gradient at this step");
  Tensor host = grad.to(kCPU).clone();
  host.set(0, injected_value());
  grad.copy_(host.to(grad.device()));
}

StepTelemetry NonfiniteGuard::input_skip_telemetry(const GradScaler& scaler,
                                                   const StepResult& result) const {
  StepTelemetry telemetry;
  telemetry.step = scaler.effective_steps();
  telemetry.scale = telemetry.next_scale = scaler.scale_value();
  telemetry.scale_event = scale_event_name(ScaleEvent::Kept);
  telemetry.found_inf = false;
  telemetry.skipped = true;
  telemetry.reason = result.reason;
  telemetry.nonfinite_tensors = result.nonfinite_tensors;
  telemetry.growth_tracker = scaler.policy().growth_tracker();
  telemetry.hysteresis_left = scaler.policy().hysteresis_left();
  return telemetry;
}

bool NonfiniteGuard::finish_step(int64_t step, StepResult& result, StepTelemetry& telemetry,
                                 std::optional<double> loss) {
  // Set again below for this step: a loop that finishes several steps after beginning them
  // all must not carry one step's flag into the next.
  nonfinite_loss_ = false;
  if (!result.skipped()) {
    skipped_in_a_row_ = 0;
    last_applied_step_ = step;
    counts_.clear();
    telemetry.skipped_in_a_row = 0;
    return false;
  }
  if (!input_skip_ && loss && !std::isfinite(*loss)) {
    nonfinite_loss_ = true;
    const std::string prefix = std::string("non-finite loss (") + value_name(*loss) + "); ";
    result.reason = prefix + result.reason;
    telemetry.reason = prefix + telemetry.reason;
    result.nonfinite_tensors.insert(result.nonfinite_tensors.begin(), kLossName);
    telemetry.nonfinite_tensors.insert(telemetry.nonfinite_tensors.begin(), kLossName);
  }
  ++skipped_in_a_row_;
  for (const std::string& name : telemetry.nonfinite_tensors) {
    const auto it = std::find_if(counts_.begin(), counts_.end(),
                                 [&](const auto& entry) { return entry.first == name; });
    if (it == counts_.end()) {
      counts_.emplace_back(name, 1);
    } else {
      ++it->second;
    }
  }
  telemetry.skipped_in_a_row = skipped_in_a_row_;
  const int64_t limit = config_.train.max_consecutive_skips;
  return limit > 0 && skipped_in_a_row_ >= limit;
}

void NonfiniteGuard::annotate(nlohmann::json& record) const {
  record["nonfinite_loss"] = nonfinite_loss_;
  if (input_skip_) {
    record["input_batch"] = bad_batch_;
    record["loss"] = nullptr;
  }
}

nlohmann::json NonfiniteGuard::stop_record(int64_t step, const GradScaler& scaler,
                                           const std::string& checkpoint) const {
  const LossScalePolicy& policy = scaler.policy();
  const bool dynamic = policy.kind() == "dynamic";
  const double scale = scaler.scale_value();
  const double min_scale = config_.loss_scale.min_scale;
  nlohmann::json counts = nlohmann::json::object();
  std::string listed;
  for (const auto& [name, count] : counts_) {
    counts[name] = count;
    listed += (listed.empty() ? "" : ", ") + name + " (" + std::to_string(count) + ")";
  }
  const int64_t first_skipped = step - skipped_in_a_row_ + 1;
  std::string message =
      "training stopped at step " + std::to_string(step) + ": " +
      std::to_string(skipped_in_a_row_) + " steps in a row were skipped (steps " +
      std::to_string(first_skipped) + "-" + std::to_string(step) +
      ", train.max_consecutive_skips = " + std::to_string(config_.train.max_consecutive_skips) +
      "); non-finite in those steps: " + (listed.empty() ? std::string("nothing named") : listed) +
      "; loss scale now " + number_text(scale) + " (" + policy.kind();
  if (dynamic) message += ", min_scale " + number_text(min_scale);
  message += "); the weights are those after step " + std::to_string(last_applied_step_) +
             ", saved in " + checkpoint + ". ";
  // What to try, from what was seen.
  const auto seen = [&](const char* name) {
    return std::any_of(counts_.begin(), counts_.end(),
                       [&](const auto& entry) { return entry.first == name; });
  };
  if (seen(kInputName)) {
    message += "The data holds Inf/NaN: check the data files and data.normalize";
  } else if (dynamic && scale <= min_scale) {
    message += "The scale is at its floor and the gradients still overflow, so the model "
               "itself produces them: lower optimizer.lr, set train.clip_grad_norm, or train "
               "in bf16";
  } else if (seen(kLossName)) {
    message += "The forward pass overflows: lower optimizer.lr or train in bf16 or fp32";
  } else {
    message += "Lower loss_scale.init_scale (or use policy dynamic), lower optimizer.lr, or "
               "train in bf16";
  }
  return nlohmann::json{
      {"event", "stopped"},
      {"step", step},
      {"skipped_in_a_row", skipped_in_a_row_},
      {"max_consecutive_skips", config_.train.max_consecutive_skips},
      {"first_skipped_step", first_skipped},
      {"last_applied_step", last_applied_step_},
      {"nonfinite_counts", counts},
      {"scale", std::isfinite(scale) ? nlohmann::json(scale) : nlohmann::json(number_text(scale))},
      {"loss_scale_policy", policy.kind()},
      {"min_scale", dynamic ? nlohmann::json(min_scale) : nlohmann::json(nullptr)},
      {"checkpoint", checkpoint},
      {"message", message},
  };
}

void NonfiniteGuard::stop(int64_t step, const GradScaler& scaler, const std::string& checkpoint,
                          MetricsLog& metrics) const {
  nlohmann::json record = stop_record(step, scaler, checkpoint);
  metrics.write(record);
  const std::string message = record["message"].get<std::string>();
  throw TrainingStopped(message, std::move(record), checkpoint);
}

}  // namespace mixprec
