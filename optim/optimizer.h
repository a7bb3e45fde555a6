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

// The device-side gate of one update (DeferredSteps in amp/deferred_steps.h makes it): the
// flag that cancels the update, the count of earlier unsettled gated updates that were
// applied, and the learning rate after each possible count. The host learns the outcome later
// and reports it with Optimizer::settle.
struct StepGate {
  Tensor found_inf;                 // F32 [1]: non-zero cancels the update
  Tensor taken;                     // I32 [1]: j, the applied earlier updates since the settle
  std::vector<double> lr_by_taken;  // lr_by_taken[j]: 1 to kMaxDeferredSteps rates
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

  // One update of the parameters, from their current gradients, which must be at true scale
  // (never call it on still-scaled gradients: GradScaler::step does the unscale and the
  // skip). One backend call per device: with parameters on two devices, a failure of the
  // second call leaves the first device's parameters updated.
  // - Without a gate: parameters that are frozen or have no gradient are left alone, and the
  //   update counts as one step taken. Throws while gated updates are unsettled.
  // - With a gate: every trainable parameter is updated, on the device, unless
  //   gate->found_inf is non-zero, at the rate gate->lr_by_taken[j] where j is the device
  //   count gate->taken; the host does not wait to learn which. The step counts once
  //   settle() says it was applied. Throws, changing nothing, where an ungated step throws,
  //   when a trainable parameter has no gradient (their step counts advance together, so
  //   each needs one) or lives on another device than the gate's tensors, when a parameter
  //   was frozen or unfrozen since the last settle, and for a table of rates outside
  //   [1, kMaxDeferredSteps] entries or a rate that is negative, non-finite or beyond FP32.
  void step(const StepGate* gate = nullptr);
  // Updates actually applied (gated ones once settled); LR schedules read this, so a step
  // that GradScaler skipped does not advance them.
  int64_t steps_taken() const { return steps_taken_; }
  // The host has read that `taken` of the gated updates since the last settle were applied
  // (the gate's owner counts them, replays of a recorded update included): counts them as
  // steps taken and settles the concrete optimizer's state (buffers started by gated updates
  // that were all skipped are dropped). Nothing to do without unsettled updates.
  void settle(int64_t taken);
  // Whether gated updates wait for settle(): an ungated step, state_dict() and
  // load_state_dict() refuse until then.
  bool unsettled() const { return unsettled_; }
  // Whether every buffer an update of the trainable parameters writes already exists (the
  // moments, or the momentum buffers once an applied update has started them), so that an
  // update creates none. A recorded step (apps/train/recorded_step.h) needs this: a
  // recording that created a buffer would reset it at every replay.
  bool buffers_started() const;

  // A sharded optimizer (ZeRO stage 1): only the parameters with owned[i] true are updated
  // by step() and keep optimizer state here; every other parameter's state is dropped now
  // and never started, and its master is left for its owner to update (and the caller to
  // copy here). Every parameter is owned by default. Throws for a mask of another length or
  // while gated steps are unsettled.
  void set_owned(std::vector<bool> owned);
  bool owned(size_t index) const { return owned_.empty() || owned_.at(index); }

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
  // all live on one device), in one backend call: applied now when `gate` is null, else
  // gated on the device as step(gate) says. A throw leaves these parameters untouched.
  virtual void update_all(const std::vector<size_t>& indices, const StepGate* gate) = 0;
  // Called by settle with how many of the gated updates were applied; each of those updated
  // every parameter for which gated(index) is true.
  virtual void settle_state(int64_t taken) = 0;
  // buffers_started()'s part for the concrete optimizer's buffers of params()[index].
  virtual bool buffers_ready(size_t index) const = 0;
  // Drops the buffers of params()[index] (set_owned's part; scalars such as step counts stay).
  virtual void release_state(size_t index) = 0;
  bool gated(size_t index) const { return gated_trainable_.at(index); }
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
  bool unsettled_ = false;
  std::vector<bool> owned_;  // empty: every parameter
  std::vector<bool> gated_trainable_;  // the parameters the unsettled gated updates update
  // step()'s checks of every gradient that the update will read.
  void check_gradients(bool every_trainable_has_one) const;
  void require_settled(const char* call) const;
  // step(gate)'s checks of the gate and of the parameters it updates.
  void check_gate(const StepGate& gate) const;
  // update_all for the parameters at `indices`, one call per device.
  void update_by_device(const std::vector<size_t>& indices, const StepGate* gate);
};

}  // namespace mixprec
