// Adam (coupled L2 weight decay, torch.optim.Adam) and AdamW (decoupled weight decay,
// torch.optim.AdamW). Per-element math: core/math/amp.h (adam_update); one
// Backend::adam_steps call per step updates every parameter's FP32 master, both moment
// buffers and working copy in one pass (one launch on a GPU). The step count used for bias
// correction is per parameter, as in torch (a parameter that had no gradient in a step does
// not advance its count).
#pragma once

#include <functional>
#include <vector>

#include "core/math/amp.h"
#include "optim/optimizer.h"

namespace mixprec {

// Which parameters receive weight decay. The default (nanoGPT's rule, and what users of
// AdamW expect): tensors with 2 or more dimensions (weights of Linear, Conv2d, Embedding)
// decay; 1-D tensors (biases, LayerNorm/BatchNorm weights) do not.
using DecayFilter = std::function<bool(const Parameter&)>;
bool decay_matrices_only(const Parameter& param);

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  // Adam: unset means every parameter (torch.optim.Adam). AdamW: unset means
  // decay_matrices_only.
  DecayFilter decay_filter;
};

class Adam : public Optimizer {
 public:
  // Throws for lr < 0, betas outside [0, 1), eps <= 0, weight_decay < 0, or non-finite values.
  Adam(std::vector<Parameter> params, AdamOptions options = {}, std::string name = "adam");
  const AdamOptions& options() const { return options_; }
  bool decoupled() const { return decoupled_; }
  // F32 buffers of params()[index], undefined until its first update.
  Tensor exp_avg(size_t index) const { return exp_avg_.at(index); }
  Tensor exp_avg_sq(size_t index) const { return exp_avg_sq_.at(index); }
  int64_t param_steps(size_t index) const { return param_steps_.at(index); }
  const char* type_name() const override { return decoupled_ ? "adamw" : "adam"; }

 protected:
  Adam(std::vector<Parameter> params, AdamOptions options, std::string name, bool decoupled);
  void update_all(const std::vector<size_t>& indices, const StepGate* gate) override;
  void settle_state(int64_t taken) override;
  bool buffers_ready(size_t index) const override;
  void release_state(size_t index) override;
  void save_state(OptimizerState& state) const override;
  void load_state(const OptimizerState& state) override;

 private:
  // The hyperparameters of params()[index] at rate `lr`, before set_step.
  AdamHyper base_hyper(size_t index, double lr) const;
  // The gated rates of params()[index] for each possible count of applied earlier updates.
  AdamRateTable rate_table(size_t index, const StepGate& gate) const;
  // The parameter's moments, zeros when it has none yet.
  void start_moments(size_t index, const Tensor& master, Tensor& exp_avg,
                     Tensor& exp_avg_sq) const;
  // Marks what an update wrote and keeps the moments.
  void keep_update(size_t index, Tensor& master, Tensor& working, Tensor& exp_avg,
                   Tensor& exp_avg_sq);

  AdamOptions options_;
  bool decoupled_ = false;
  std::vector<bool> decays_;  // per parameter, from the filter
  std::vector<Tensor> exp_avg_;
  std::vector<Tensor> exp_avg_sq_;
  std::vector<int64_t> param_steps_;
};

class AdamW final : public Adam {
 public:
  AdamW(std::vector<Parameter> params, AdamOptions options = {}, std::string name = "adamw");
};

}  // namespace mixprec
