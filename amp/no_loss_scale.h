// NoLossScale: S = 1 and no multiplication (the default for fp32 and bf16). GradScaler still
// checks gradients for Inf/NaN and skips a step that has them.
#pragma once

#include "amp/loss_scale.h"

namespace mixprec {

class NoLossScale final : public LossScalePolicy {
 public:
  std::string kind() const override { return "none"; }
  double scale() const override { return 1.0; }
  bool scales_loss() const override { return false; }
  ScaleChange update(bool found_inf) override;
  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;
  std::unique_ptr<LossScalePolicy> clone() const override;
};

}  // namespace mixprec
