// SGD with momentum, dampening, Nesterov momentum and (coupled) weight decay, with
// torch.optim.SGD's semantics (per-element math: core/math/amp.h, sgd_update). One
// Backend::sgd_steps call per step updates every parameter's FP32 master, momentum buffer
// and working copy in one fused pass (one launch on a GPU).
#pragma once

#include <vector>

#include "core/math/amp.h"
#include "optim/optimizer.h"

namespace mixprec {

struct SgdOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

class SGD final : public Optimizer {
 public:
  // Throws for lr < 0, momentum < 0, weight_decay < 0, non-finite values, or nesterov
  // without momentum or with dampening (as PyTorch does).
  SGD(std::vector<Parameter> params, SgdOptions options = {}, std::string name = "sgd");
  const SgdOptions& options() const { return options_; }
  // The momentum buffer of params()[index] (F32, undefined until its first update or when
  // momentum is 0).
  Tensor momentum_buffer(size_t index) const { return momentum_.at(index); }
  const char* type_name() const override { return "sgd"; }

 private:
  void update_all(const std::vector<size_t>& indices, const StepGate* gate) override;
  void settle_state(int64_t taken) override;
  // Without momentum there is none; with it, a buffer that an applied update started.
  bool buffers_ready(size_t index) const override;
  void release_state(size_t index) override;
  SgdHyper base_hyper(double lr) const;
  // The gated rates for each possible count j of applied earlier updates; `unstarted`: the
  // momentum buffer has no applied update yet, so entry 0 (the first taken step) starts it.
  static SgdRateTable rate_table(const StepGate& gate, bool unstarted);
  // Marks what an update wrote and keeps the buffer.
  void keep_update(size_t index, Tensor& master, Tensor& working, Tensor& buffer);
  // The momentum buffers as "momentum.<index>" (those defined); no scalars beyond the base's.
  // Loading buffers into an SGD without momentum throws (they would be ignored); a parameter
  // without a stored buffer starts its momentum afresh on its next update, as in torch.
  void save_state(OptimizerState& state) const override;
  void load_state(const OptimizerState& state) override;
  SgdOptions options_;
  std::vector<Tensor> momentum_;
  // True for a buffer that gated steps started and no settle has confirmed yet.
  std::vector<bool> momentum_unsettled_;
};

}  // namespace mixprec
