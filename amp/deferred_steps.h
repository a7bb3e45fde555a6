// DeferredSteps: GradScaler's step with no host round-trip (DESIGN.md section 4, "no host
// round-trip per step on the GPU"). The loss scale, the Inf/NaN check, the skip, the clip,
// the optimizer's step counts and the learning rate it reads are decided on the device; the
// host learns what happened when it resolves, normally at log steps, in two or three reads
// for all the steps since the last resolve.
//
//   DeferredSteps deferred(scaler, optimizer);   // between steps; scaler and optimizer outlive it
//   for each step:
//     optimizer.zero_grad();
//     deferred.scale(loss).backward();           // microbatches: scale(loss, samples / total)
//     deferred.unscale();
//     deferred.clip_grad_norm(params, 1.0);      // optional
//     deferred.step(&schedule);                  // queues the update, its skip and the scale update
//     if (log step) for (ResolvedStep& r : deferred.resolve()) ... r.result, r.telemetry ...
//
// resolve() replays every pending step through the host's GradScaler and Optimizer, so their
// state, telemetry and checkpoints are exactly those of the regular path
// (scaler.step/update): the device ran the same rule (core/math/amp.h) on the same flags, the
// updates used the same per-step values (AdamHyper::set_step, the schedule), and the clip the
// same coefficient. What differs is when the host knows (a skipped step is reported at the
// next resolve, not at once) and the clip norm in the telemetry, read back as a float.
//
// Each step is one Optimizer::step with a StepGate: the flag, the device count of the
// window's taken steps (this object's, reset at each resolve) and the rates.
//
// Restrictions, each a clear mixprec::Error: every trainable parameter of the optimizer must
// have a gradient in every step and the set of trainable parameters must not change while
// steps are pending (Optimizer::step), at most kMaxDeferredSteps steps are pending (full()
// says when to resolve), and the scaler must not be inside a regular step or accumulation
// window. One DeferredSteps per scaler: two would each move its scale. Resolve before
// destroying it: an optimizer with unsettled steps refuses regular steps and state_dict(). GradScaler's tag checks (gradients never scaled, stale scales) are
// not repeated here: the steps are driven by one caller that scales every loss itself.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "amp/grad_scaler.h"
#include "optim/lr_schedule.h"

namespace mixprec {

struct ResolvedStep {
  StepResult result;
  StepTelemetry telemetry;
};

class DeferredSteps {
 public:
  // Copies the scaler's current scale state to the optimizer's device. The scaler may be
  // disabled (every step is then taken and nothing is checked).
  DeferredSteps(GradScaler& scaler, Optimizer& optimizer);
  DeferredSteps(const DeferredSteps&) = delete;
  DeferredSteps& operator=(const DeferredSteps&) = delete;

  // loss (floating scalar, any dtype; widened to F32) times S * weight, S being the device's
  // current scale; weight is a microbatch's share of the effective batch (1 for a whole
  // batch). The gradients backward writes are tagged with the scale the host expects.
  // Throws for a weight outside (0, 1] and while full().
  Tensor scale(const Tensor& loss, double weight = 1.0);
  // Divides every gradient of the optimizer by the device's S and records which were
  // non-finite, on the device. Once per step, after the last backward.
  void unscale();
  // clip_grad_norm_on_device over `params`, after unscale(); the norm is read at resolve.
  void clip_grad_norm(const std::vector<Parameter>& params, double max_norm);
  // Queues the optimizer's update (skipped on the device when a gradient was non-finite) and
  // the scale update. The learning rate after j taken pending steps is
  // schedule->lr_at(steps taken + j) for j >= 1 and the optimizer's lr() for j = 0, as the
  // regular loop sets it after each taken step; a null schedule keeps lr(). Throws when
  // unscale() has not run in this step.
  void step(const LrSchedule* schedule);

  // Reads the flags (and the clip norms) of every pending step in one go, replays them in
  // order through GradScaler::finish_deferred_step and Optimizer::settle, and
  // returns their outcomes in step order. Throws when a step is in progress (scaled but not
  // stepped), and like GradScaler::update under FloorPolicy::Error, naming the pending step;
  // the steps after it have run on the device by then, so this object then refuses every
  // further call (a training run ends there).
  std::vector<ResolvedStep> resolve();

  // ---- steps captured into a CUDA graph (apps/train/captured_step.h) ----
  // A captured step ran scale() .. step() once, during the capture, queuing nothing; each
  // replay of the graph queues that work again, writing the same flag and norm tensors. After
  // the first replay, keep_captured_step() makes the last pending step hold copies of them
  // (queued now, so they are the replay's) and remembers the graph's tensors; after each
  // further replay, add_replayed_step() adds a pending step with new copies and the host's
  // bookkeeping of step(). Both throw unless Ready; add_replayed_step() also when full(),
  // or when no step was captured since the last resolve.
  void keep_captured_step();
  void add_replayed_step();

  int64_t pending() const { return static_cast<int64_t>(pending_.size()); }
  // True when no further step fits before resolve().
  bool full() const { return pending() >= kMaxDeferredSteps; }

 private:
  enum class Stage { Ready, Scaled, Unscaled };
  struct PendingStep {
    Tensor flags;  // I32 [number of gradients checked]: 1 where non-finite
    Tensor norm;   // F32 [1], or undefined without clipping
    std::vector<std::string> names;  // the checked gradients' parameters, in order
  };
  void require_stage(Stage stage, const char* call) const;
  void require_usable() const;

  GradScaler& scaler_;
  Optimizer& optimizer_;
  Device device_;
  Tensor scale_state_;  // I32 [kDynamicScaleStateWords] on device_
  std::optional<DynamicScaleRule> rule_;  // set when the scale moves
  // The host's policy advanced as if every pending step was finite: the scale gradients are
  // tagged with. The device's scale differs only after an unresolved overflow.
  std::unique_ptr<LossScalePolicy> expected_;
  Stage stage_ = Stage::Ready;
  Tensor found_inf_;  // this step's F32 [1] flag
  Tensor taken_;      // I32 [1]: the pending steps that were taken, counted on the device
  PendingStep current_;
  std::vector<PendingStep> pending_;
  // The graph's own tensors (keep_captured_step), until resolve.
  std::optional<PendingStep> captured_;
  bool failed_ = false;  // a resolve threw part-way: see resolve()
  std::string failure_;
};

}  // namespace mixprec
