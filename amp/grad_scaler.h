// GradScaler: applies a loss-scale policy around backward, with a per-optimizer state
// machine, per-tensor overflow reports and gradient accumulation (DESIGN.md section 4).
//
//   Tensor loss = ...;                       // F32 scalar
//   scaler.scale(loss).backward();           // gradients land in FP32 buffers, times S
//   scaler.unscale(optimizer);               // optional: needed before clip_grad_norm
//   clip_grad_norm(params, 1.0);
//   StepResult r = scaler.step(optimizer);   // unscales if needed; skips on Inf/NaN
//   StepTelemetry t = scaler.update();       // moves the scale once per effective step
//
// Per optimizer, within one effective step: READY --unscale--> UNSCALED --step--> STEPPED,
// with step() from READY also allowed (it unscales first). update() returns every optimizer
// to READY. Calls out of this order throw mixprec::Error saying what to do instead.
//
// Several optimizers share one scale: each skips on its own gradients, and an overflow in
// any of them backs the shared scale off at update().
//
// Gradient accumulation: begin_accumulation(N) opens a window of N samples; each microbatch
// calls scale(loss, n) which weights its (mean) loss by n / N, so the accumulated gradient is
// the mean over the whole effective batch. unscale/step/update throw until exactly N samples
// were scaled, and the scale cannot change inside the window.
//
// Scales are tracked per gradient (Tensor::grad_scale): unscale refuses gradients that were
// never scaled or carry another step's scale, and zeros from zero_grad(false) fit any scale.
//
// enabled = false turns every call into a pass-through: scale() returns the loss itself,
// unscale() does nothing, step() calls optimizer.step() unconditionally, update() only
// counts the step.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "amp/loss_scale.h"
#include "amp/step_telemetry.h"
#include "core/tensor.h"
#include "optim/optimizer.h"

namespace mixprec {

struct StepResult {
  enum class Outcome { Stepped, Skipped };
  Outcome outcome = Outcome::Stepped;
  std::string reason;  // empty when stepped; e.g. "non-finite gradients in 2 tensors (scale 65536)"
  std::vector<std::string> nonfinite_tensors;  // parameter names, in the optimizer's order
  bool stepped() const { return outcome == Outcome::Stepped; }
  bool skipped() const { return outcome == Outcome::Skipped; }
};

class GradScaler {
 public:
  explicit GradScaler(std::unique_ptr<LossScalePolicy> policy, bool enabled = true);

  bool enabled() const { return enabled_; }
  // The current scale S (1 when disabled or under NoLossScale).
  double scale_value() const;
  const LossScalePolicy& policy() const { return *policy_; }

  // loss (floating, any shape; widened to F32) times S, tagged so that backward marks the
  // gradients it writes as scaled by S (Tensor::loss_scale). Outside an accumulation window
  // this is the whole effective batch.
  Tensor scale(const Tensor& loss);
  // One microbatch of `samples` samples inside an accumulation window: loss * S * samples / N.
  // Throws outside a window, for samples < 1, or when the window would exceed N.
  Tensor scale(const Tensor& loss, int64_t samples);

  // Opens an accumulation window of `total_samples` samples (>= 1). Throws when one is
  // already open or when unscale/step already ran in this effective step.
  void begin_accumulation(int64_t total_samples);
  bool in_accumulation_window() const { return window_total_ > 0; }

  // Divides the optimizer's gradients by S in one fused pass and records, per tensor, which
  // were non-finite. Throws on a second unscale, after step, inside an unfinished
  // accumulation window, or when no scale() ran in this effective step (gradients never
  // scaled).
  void unscale(Optimizer& optimizer);
  // Unscales first if unscale() was not called, then runs optimizer.step() unless a
  // gradient was non-finite. Gradients written since unscale() (clipping, a late backward)
  // are checked again before the optimizer reads them. Throws on a second step, inside an
  // unfinished window, or when the optimizer has no gradients (nothing was checked). If
  // optimizer.step() itself throws, the exception passes through and the next update()
  // throws too, without moving the scale or counting the step.
  StepResult step(Optimizer& optimizer);
  // Moves the scale once (backing off if any optimizer saw Inf/NaN), returns every optimizer
  // to READY, closes the accumulation window and returns this step's telemetry. Throws when
  // no optimizer was stepped since the last update ("no recorded check"), and, under
  // FloorPolicy::Error, when an overflow arrives with the scale at min_scale — the message
  // names the tensors that kept overflowing; the scale and counters are left as they were.
  StepTelemetry update();

  // A step checked on the device and read back later (amp/deferred_steps.h), as update()
  // would have reported it.
  struct DeferredOutcome {
    StepResult result;
    StepTelemetry telemetry;
  };
  // Finishes one effective step of `optimizer` whose unscale, check and update ran on the
  // device: `nonfinite` names its non-finite gradients (empty: it was taken), grad_norm is
  // its clip norm (-1: none). Moves the host's policy exactly as update() would (the device
  // ran the same rule) and counts the step; throws like update() under FloorPolicy::Error,
  // and when a regular step is in progress.
  DeferredOutcome finish_deferred_step(const Optimizer& optimizer,
                                       const std::vector<std::string>& nonfinite,
                                       double grad_norm);

  // Attaches a gradient norm (e.g. clip_grad_norm's result) to this step's telemetry.
  void record_grad_norm(double norm);
  // Effective steps completed (update() calls), skipped ones included.
  int64_t effective_steps() const { return effective_steps_; }

  // {"enabled", "effective_steps", "skipped_in_a_row", "policy": policy.state_dict()}.
  // Taken between steps (every optimizer READY); load throws, naming the field, on a
  // malformed state or one whose policy kind differs from this scaler's.
  nlohmann::json state_dict() const;
  void load_state_dict(const nlohmann::json& state);

 private:
  enum class Stage { Ready, Unscaled, Stepped };
  // A gradient as unscale() checked it: the tensor and the version of its data.
  struct CheckedGrad {
    Tensor grad;
    uint64_t version = 0;
  };
  struct OptimizerRecord {
    Stage stage = Stage::Ready;
    bool found_inf = false;
    std::vector<std::string> nonfinite_tensors;
    bool skipped = false;
    std::vector<CheckedGrad> checked;
    std::string failure;  // what optimizer.step() threw, if it did
  };
  OptimizerRecord& record_for(Optimizer& optimizer);
  void require_window_complete(const char* call) const;
  void unscale_record(Optimizer& optimizer, OptimizerRecord& record);
  // True when a gradient was replaced, written or added after unscale() checked it.
  static bool changed_since_unscale(const Optimizer& optimizer, const OptimizerRecord& record);
  // Checks the current gradients again (no unscaling) and merges the result into `record`.
  void recheck(Optimizer& optimizer, OptimizerRecord& record);
  Tensor scaled_loss(const Tensor& loss, double weight);
  // update()'s second half: `telemetry` holds step, scale, grad_norm, found_inf, skipped and
  // the names; adds the reason, moves the policy (not when disabled), counts the step.
  StepTelemetry close_step(StepTelemetry telemetry);
  static StepResult skip_result(const Optimizer& optimizer,
                                const std::vector<std::string>& nonfinite, double scale);
  // Returns every optimizer to READY and closes the window; finish_step also counts the
  // effective step.
  void abandon_step();
  void finish_step();

  std::unique_ptr<LossScalePolicy> policy_;
  bool enabled_;
  std::map<const Optimizer*, OptimizerRecord> records_;
  bool scaled_this_step_ = false;
  double step_scale_ = 1.0;  // the scale used by scale() in this effective step
  int64_t window_total_ = 0;
  int64_t window_seen_ = 0;
  double grad_norm_ = -1.0;
  int64_t effective_steps_ = 0;
  int64_t skipped_in_a_row_ = 0;
  std::map<std::string, int64_t> overflow_counts_;  // per tensor, over the current skip run
};

}  // namespace mixprec
