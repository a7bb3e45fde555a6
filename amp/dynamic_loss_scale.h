// DynamicLossScale: PyTorch GradScaler's rule (back off on overflow, grow after
// growth_interval finite steps) plus hysteresis, a floor with a policy, and a ceiling. The
// rule itself is update_dynamic_scale (core/math/amp.h), shared with the device.
#pragma once

#include "amp/loss_scale.h"

namespace mixprec {

struct DynamicLossScaleOptions {
  double init_scale = 65536.0;  // 2^16, PyTorch's default
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int growth_interval = 2000;
  // Overflows tolerated before a backoff; 1 backs off on every overflow, as PyTorch does.
  int hysteresis = 1;
  HysteresisMode hysteresis_mode = HysteresisMode::ResetOnGrowth;
  double min_scale = 1.0;
  double max_scale = 16777216.0;  // 2^24
  FloorPolicy floor_policy = FloorPolicy::Clamp;
};

// Throws mixprec::Error naming the first invalid setting: growth_factor > 1,
// 0 < backoff_factor < 1, growth_interval >= 1, hysteresis >= 1,
// 0 < min_scale <= init_scale <= max_scale, every value finite.
void validate(const DynamicLossScaleOptions& options);

class DynamicLossScale final : public LossScalePolicy {
 public:
  explicit DynamicLossScale(DynamicLossScaleOptions options = {});
  std::string kind() const override { return "dynamic"; }
  double scale() const override { return state_.scale; }
  ScaleChange update(bool found_inf) override;
  int growth_tracker() const override { return state_.growth_tracker; }
  int hysteresis_left() const override { return state_.hysteresis_left; }
  FloorPolicy floor_policy() const override { return options_.floor_policy; }
  std::optional<DynamicScaleRule> device_rule() const override { return rule_; }
  const DynamicLossScaleOptions& options() const { return options_; }
  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;
  std::unique_ptr<LossScalePolicy> clone() const override;

 private:
  DynamicLossScaleOptions options_;
  DynamicScaleRule rule_;
  DynamicScaleState state_;
};

}  // namespace mixprec
