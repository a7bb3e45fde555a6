// Optimizer: the interface every optimizer implements (SGD now; Adam and AdamW with the
// training issue). An optimizer owns per-parameter state, reads true-scale FP32 gradients,
// updates the FP32 masters and rewrites the working copies in the same pass.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "layers/parameter.h"

namespace mixprec {

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
  // are frozen or have no gradient are left alone. Counts one step taken.
  void step();
  // Updates actually applied; LR schedules read this, so a step that GradScaler skipped
  // does not advance them.
  int64_t steps_taken() const { return steps_taken_; }

  // Drops every gradient (set_to_none) or zero-fills it.
  void zero_grad(bool set_to_none = true);

  double lr() const { return lr_; }
  // Throws for a negative or non-finite value.
  void set_lr(double lr);

 protected:
  // The update of one parameter that has a gradient; `index` is its position in params().
  virtual void update(size_t index, const Parameter& param, const Tensor& grad) = 0;
  void set_initial_lr(double lr) { set_lr(lr); }

 private:
  std::vector<Parameter> params_;
  std::string name_;
  double lr_ = 0.0;
  int64_t steps_taken_ = 0;
};

}  // namespace mixprec
