// StaticLossScale: one fixed scale S for every step. Overflowing steps are still skipped
// (GradScaler checks every step), but S never moves.
#pragma once

#include "amp/loss_scale.h"

namespace mixprec {

class StaticLossScale final : public LossScalePolicy {
 public:
  // Throws unless scale is finite and > 0.
  explicit StaticLossScale(double scale);
  std::string kind() const override { return "static"; }
  double scale() const override { return scale_; }
  ScaleChange update(bool found_inf) override;
  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;
  std::unique_ptr<LossScalePolicy> clone() const override;

 private:
  double scale_;
};

}  // namespace mixprec
