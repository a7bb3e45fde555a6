// Optimizer: the interface every optimizer implements (SGD, Adam, AdamW). An optimizer owns
// per-parameter state, reads true-scale FP32 gradients, updates the FP32 masters and rewrites
// the working copies in the same pass.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "layers/parameter.h"

namespace mixprec {

// What an optimizer needs to queue a deferred update (step_deferred): the device flag that
// cancels it, the device count j of earlier unresolved steps that were taken, and the
// learning rate for each possible j.
struct DeferredUpdate {
  Tensor found_inf;             // F32 [1]
  Tensor taken;                 // I32 [1]
  std::vector<double> lr_by_taken;  // deferred_pending() + 1 to kMaxDeferredSteps rates
};

// What a checkpoint keeps of an optimizer: JSON scalars and named F32 tensors (moment buffers,
// keyed "<buffer>.<parameter index>", e.g. "exp_avg.3"). The checkpoint code stores the
// tensors bit-exactly, so a resumed run continues with the same bits.
struct OptimizerState {
  nlohmann::json scalars = nlohmann::json::object();
  std::vector<std::pair<std::string, Tensor>> tensors;
};

class Optimizer {
 public:
  // Throws for an empty list, an undefined parameter, or one listed twice.
  Optimizer(std::vector<Parameter> params, std::string name);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // "sgd", or the label given by the caller; names this optimizer in messages.
  const std::string& name() const { return name_; }
  const std::vector<Parameter>& params() const { return params_; }

  // One update from the current gradients, which must be at true scale (never call it on
  // still-scaled gradients: GradScaler::step does the unscale and the skip). Parameters that
  // are frozen or have no gradient are left alone. Counts one step taken. One backend call
  // per device: with parameters on two devices, a failure of the second call leaves the
  // first device's parameters updated.
  void step();
  // Updates actually applied (resolved ones, for deferred steps); LR schedules read this, so a step that GradScaler skipped
  // does not advance them.
  int64_t steps_taken() const { return steps_taken_; }

  // ---- deferred steps: skipped or not, decided on the device (amp/deferred_steps.h) ----
  // Queues one update of every trainable parameter that the device flag found_inf (F32 [1],
  // on the parameters' device) cancels when non-zero; the host does not wait to learn which.
  // An update uses lr_by_taken[j], where j counts the earlier unresolved deferred steps that
  // were taken, so lr_by_taken holds at least deferred_pending() + 1 rates (lr_by_taken[0] is
  // normally lr()) and at most kMaxDeferredSteps. DeferredSteps gives all kMaxDeferredSteps,
  // the same for every step between two resolves, so that the tables the device reads stay
  // byte for byte the same across those steps (which a captured CUDA graph relies on).
  // steps_taken() does not count a deferred step until resolve_deferred().
  // Throws, changing nothing, where step() throws, when a trainable parameter has no
  // gradient (their step counts advance together, so each needs one), lives on another
  // device than the first parameter (where found_inf and the count must be), or was frozen or
  // unfrozen while steps are pending, when a regular step() is mixed in, and when
  // kMaxDeferredSteps steps are already pending.
  void step_deferred(const Tensor& found_inf, const std::vector<double>& lr_by_taken);
  int64_t deferred_pending() const { return deferred_pending_; }
  // Steps captured into a CUDA graph (apps/train/captured_step.h), whose replays queue the
  // same work on the same tensors. Whether the next step_deferred() would find every buffer
  // it writes already there (the device count; the moments, or the momentum buffers once an
  // applied update has started them), instead of creating one: a captured step that created
  // a buffer would reset it at every replay.
  bool deferred_state_ready() const;
  // Counts one more pending deferred step, queued by a replay of a captured step_deferred():
  // throws as step_deferred does when kMaxDeferredSteps are pending, or when none is (a
  // replay repeats a step of the same window).
  void count_replayed_deferred_step();
  // The host has read that `taken` (0 ..= deferred_pending()) of the pending steps were
  // applied: counts them as steps taken, settles the concrete optimizer's state (buffers
  // started by steps that were all skipped are dropped) and restarts the device count.
  void resolve_deferred(int64_t taken);

  // Drops every gradient (set_to_none) or zero-fills it.
  void zero_grad(bool set_to_none = true);

  double lr() const { return lr_; }
  // Throws for a negative or non-finite value.
  void set_lr(double lr);

  // scalars: {"type": type_name(), "name", "steps_taken", "lr", "params": [names in order],
  // plus what the concrete optimizer adds}; tensors: copies (on the CPU) of its buffers.
  OptimizerState state_dict() const;
  // Restores a state_dict() of the same type over the same parameters (names and shapes,
  // in order). Everything is checked before anything is written: a different type, other
  // parameters, a missing or misshapen buffer throw mixprec::Error saying which, and the
  // optimizer is unchanged.
  void load_state_dict(const OptimizerState& state);
  // "sgd", "adam", "adamw".
  virtual const char* type_name() const = 0;

 protected:
  // Adds the concrete optimizer's scalars and its defined buffers (the live tensors;
  // state_dict() copies them to the CPU) to `state`.
  virtual void save_state(OptimizerState& state) const = 0;
  // Checks then restores them; on a bad state throws before changing anything. Called by
  // load_state_dict once the common part is checked: the scalars "type", "steps_taken", "lr"
  // and "params" are valid, and every tensor is a defined F32 tensor named
  // "<buffer>.<index>", index < params().size(), shaped like that parameter, listed once.
  virtual void load_state(const OptimizerState& state) = 0;
  // The updates of params()[i] for every i in `indices` (ascending; each has a gradient and
  // all live on one device), in one backend call: immediate when `deferred` is null, else
  // the deferred form queued by step_deferred. A throw leaves these parameters untouched.
  virtual void update_all(const std::vector<size_t>& indices, const DeferredUpdate* deferred) = 0;
  // Called by resolve_deferred with how many of the pending steps were taken; each of those
  // updated every parameter for which updated_by_deferred() is true.
  virtual void resolve_deferred_state(int64_t taken) = 0;
  // deferred_state_ready()'s part for the concrete optimizer's buffers of params()[index].
  virtual bool buffers_ready(size_t index) const = 0;
  bool updated_by_deferred(size_t index) const { return deferred_trainable_.at(index); }
  void set_initial_lr(double lr) { set_lr(lr); }

  // Helpers for load_state. The tensor stored as "<buffer>.<index>", or null.
  static const Tensor* find_buffer(const OptimizerState& state, const std::string& buffer,
                                   size_t index);
  // Throws naming the first tensor of `state` whose buffer is not one of `known`.
  void check_known_buffers(const OptimizerState& state,
                           const std::vector<std::string>& known) const;
  // A copy of a stored buffer on params()[index]'s device, never sharing the stored data.
  Tensor restore_buffer(const Tensor& stored, size_t index) const;

 private:
  std::vector<Parameter> params_;
  std::string name_;
  double lr_ = 0.0;
  int64_t steps_taken_ = 0;
  int64_t deferred_pending_ = 0;
  std::vector<bool> deferred_trainable_;  // the parameters the pending steps update
  Tensor taken_on_device_;  // I32 [1], created by the first deferred step
  // step()'s checks of every gradient that the update will read.
  void check_gradients(bool every_trainable_has_one) const;
  void require_no_deferred(const char* call) const;
  // update_all for the parameters at `indices`, one call per device.
  void update_by_device(const std::vector<size_t>& indices, const DeferredUpdate* deferred);
};

}  // namespace mixprec
