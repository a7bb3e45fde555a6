// NonfiniteGuard: what the training loop does about Inf and NaN besides the scaler's check of
// the gradients — debug.inject_nonfinite, the host-side check of input batches, naming a
// non-finite loss, and stopping a run that keeps skipping (train.max_consecutive_skips).
//
// Per step, in the loop's order:
//   std::optional<StepResult> bad = guard.begin_step(step, batches);  // all microbatches
//   if (!bad) {
//     ... loss = guard.loss(step, micro, loss); backward ...
//     guard.gradients(step);                       // before unscale/step
//     result = scaler.step(...); telemetry = scaler.update();
//   } else {
//     result = *bad; telemetry = guard.input_skip_telemetry(scaler, result);
//   }
//   ... read the loss on skipped steps ...
//   const bool stop = guard.finish_step(step, result, telemetry, loss if it was read);
//   record = telemetry.to_json() ...; guard.annotate(record);  metrics.write(record);
//   if (stop) { save a checkpoint; guard.stop(...) }       // throws TrainingStopped
//
// Costs: the input check of a prefetched batch reads only its input_scan, which the
// prefetcher's thread made on the host before the upload (apps/data/prefetcher.h); a batch
// built without one (tests, other callers) is scanned here, on the host. Nothing here reads
// the device except a step that was skipped anyway (its loss), so on a GPU a good step stays
// free of host synchronisations.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "amp/grad_scaler.h"
#include "amp/step_telemetry.h"
#include "apps/config/train_config.h"
#include "apps/data/batch.h"
#include "apps/train/run_directory.h"
#include "dist/communicator.h"
#include "layers/module.h"

namespace mixprec {

class NonfiniteGuard {
 public:
  // Checks debug.inject_nonfinite against the model and the data; mixprec::Error (bad input,
  // thrown before the run folder is written) for a tensor that is neither a parameter nor
  // `loss` nor `input`, for `input` with integer inputs (token ids), and for a step beyond
  // `total_steps`.
  // With `ranks` of more than one rank, debug.inject_nonfinite.rank (-1: every rank) picks
  // the rank that injects (one beyond the ranks is bad input), and the ranks agree on every
  // step's input check (input_is_bad and begin_step are then collectives): a bad input on
  // one rank skips the step on all.
  NonfiniteGuard(const TrainConfig& config, const std::vector<Parameter>& params,
                 const BatchSource& data, int64_t total_steps,
                 dist::Communicator* ranks = nullptr);

  // A resumed run continues the count of skipped steps in a row where the checkpoint left it
  // (the scaler's skipped_in_a_row and per-tensor counts); `step` is the checkpoint's step.
  // Steps skipped for their input are not in the scaler's state and start from zero.
  void resume_from(const GradScaler& scaler, int64_t step);

  // Called with every microbatch of step `step` before any reaches the model: puts the
  // injected value into the first batch's first element when the injection is `input` (on a
  // copy of its inputs, on their device, and sets that batch's input_scan to element 0 and
  // the value without reading it back), then checks every floating input: through the
  // batch's input_scan when it is set, else with scan_inputs. Returns a skipped StepResult
  // naming the first bad batch ("input batch 12 has a non-finite value (nan) at element 0",
  // nonfinite_tensors {"input"}), or nullopt when every value is finite. Integer inputs are
  // not checked.
  std::optional<StepResult> begin_step(int64_t step, std::vector<Batch>& batches);

  // True when begin_step(step, batches) would skip the step for its input, without beginning
  // it (a loop that still has steps to finish first asks before beginning this one); the
  // scan is kept for begin_step of the same step, so the batches are read once.
  bool input_is_bad(int64_t step, const std::vector<Batch>& batches);

  // The loss of microbatch `micro` of `step` (F32 scalar), multiplied by Inf/NaN when the
  // injection is `loss` at this step and micro == 0; otherwise `loss` itself.
  Tensor loss(int64_t step, int64_t micro, const Tensor& loss) const;
  // Writes Inf/NaN into the first element of the named parameter's gradient when the
  // injection names a parameter at this step. After backward, before unscale.
  void gradients(int64_t step) const;
  // True when debug.inject_nonfinite puts its value into step `step` (any target).
  bool injects_at(int64_t step) const {
    return target_ != Target::None && step == config_.debug.inject_step;
  }

  // Telemetry for a step skipped for its input: the scaler was not used, so the scale, the
  // growth tracker and the hysteresis stay as they were and found_inf is false.
  StepTelemetry input_skip_telemetry(const GradScaler& scaler, const StepResult& result) const;

  // Counts the finished step and returns true when the run must stop: the step was skipped
  // and it is the train.max_consecutive_skips-th in a row (never when that is 0). On a step
  // skipped by the scaler whose `loss` (when it was read) is not finite, names "loss" first
  // in result's and telemetry's nonfinite_tensors and prefixes their reason with
  // "non-finite loss (inf); ". Sets telemetry.skipped_in_a_row to this guard's count (input
  // skips included).
  bool finish_step(int64_t step, StepResult& result, StepTelemetry& telemetry,
                   std::optional<double> loss);

  // Adds to this step's metrics record: "nonfinite_loss" (bool); for an input skip,
  // "input_batch" (its number) and "loss": null (no forward ran).
  void annotate(nlohmann::json& record) const;

  // The {"event": "stopped", ...} record: step, skipped_in_a_row, max_consecutive_skips, the
  // first skipped step of the run of skips and the last applied one, "nonfinite_counts"
  // (name -> steps it was non-finite in, "loss" and "input" included), "scale",
  // "loss_scale_policy", "min_scale" (null unless dynamic), "checkpoint" and "message".
  nlohmann::json stop_record(int64_t step, const GradScaler& scaler,
                             const std::string& checkpoint) const;
  // Writes stop_record to `metrics` and throws TrainingStopped with its message.
  [[noreturn]] void stop(int64_t step, const GradScaler& scaler, const std::string& checkpoint,
                         MetricsLog& metrics) const;

  int64_t skipped_in_a_row() const { return skipped_in_a_row_; }

 private:
  enum class Target { None, Parameter, Loss, Input };
  // The first non-finite input value of a step's batches (bad_batch -1: none).
  struct StepScan {
    int64_t step = 0;
    int64_t bad_batch = -1;  // the number of the first bad batch
    InputScan found;         // that batch's scan
  };
  // The injection's target (resolving a parameter's name); throws for a name that is none.
  Target injection_target(const TrainConfig& config, const std::vector<Parameter>& params,
                          const BatchSource& data);
  StepScan scan_step(int64_t step, const std::vector<Batch>& batches) const;
  // The first bad batch over every rank's scan (a collective).
  StepScan agree(StepScan scan) const;
  double injected_value() const;

  const TrainConfig& config_;
  dist::Communicator* ranks_ = nullptr;  // set only with more than one rank
  Target target_ = Target::None;
  Parameter parameter_;  // Target::Parameter
  // This step.
  bool input_skip_ = false;
  int64_t bad_batch_ = -1;
  bool nonfinite_loss_ = false;
  // The run of skipped steps.
  int64_t skipped_in_a_row_ = 0;
  int64_t last_applied_step_ = 0;
  std::vector<std::pair<std::string, int64_t>> counts_;  // in order of first appearance
  std::optional<StepScan> scan_;  // input_is_bad's, until begin_step uses it
};

}  // namespace mixprec
