// Loss-scale policies: one interface, three implementations (static_loss_scale.h,
// dynamic_loss_scale.h, no_loss_scale.h). A policy holds a number and a rule for moving it;
// it never sees tensors. GradScaler (grad_scaler.h) applies it.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/math/amp.h"

namespace mixprec {

// What happens when an overflow arrives with the scale already at min_scale.
enum class FloorPolicy {
  Clamp,  // stay at min_scale and keep skipping (the telemetry records each skip)
  Warn,   // the same, with a warning in the log each time
  Error,  // stop: GradScaler::update throws a diagnostic naming the tensors that overflow
};

// "clamp", "warn", "error"; anything else throws.
FloorPolicy parse_floor_policy(const std::string& text);
std::string floor_policy_name(FloorPolicy policy);
// "reset_on_growth", "consecutive"; anything else throws.
HysteresisMode parse_hysteresis_mode(const std::string& text);
std::string hysteresis_mode_name(HysteresisMode mode);

// The result of one update(): the scale before and after, and what moved it.
struct ScaleChange {
  double before = 1.0;
  double after = 1.0;
  ScaleEvent event = ScaleEvent::Kept;
};

// "kept", "grew", "backed_off", "overflow_tolerated", "overflow_at_floor".
std::string scale_event_name(ScaleEvent event);

class LossScalePolicy {
 public:
  virtual ~LossScalePolicy() = default;
  // "static", "dynamic" or "none".
  virtual std::string kind() const = 0;
  // The current scale S (1 for NoLossScale).
  virtual double scale() const = 0;
  // False for NoLossScale: losses are not multiplied and gradients are only checked.
  virtual bool scales_loss() const { return true; }
  // Moves the scale after one effective step whose gradients were (found_inf) or were not
  // all finite. Called exactly once per effective step, by GradScaler::update.
  virtual ScaleChange update(bool found_inf) = 0;
  // Counters for telemetry (0 where a policy has none).
  virtual int growth_tracker() const { return 0; }
  virtual int hysteresis_left() const { return 0; }
  virtual FloorPolicy floor_policy() const { return FloorPolicy::Clamp; }
  // The rule a device can run to move this scale (Backend::update_loss_scale), or nullopt
  // for a scale that never moves.
  virtual std::optional<DynamicScaleRule> device_rule() const { return std::nullopt; }
  // Every setting and every piece of state, enough to continue the exact trajectory:
  // {"kind": ..., ...}. load_state_dict accepts only the same kind and throws, naming the
  // field, for a missing or invalid one; settings are validated as by the constructor.
  virtual nlohmann::json state_dict() const = 0;
  virtual void load_state_dict(const nlohmann::json& state) = 0;
  virtual std::unique_ptr<LossScalePolicy> clone() const = 0;
};

// Builds the policy that `state` (a state_dict()) describes, with its state restored.
std::unique_ptr<LossScalePolicy> loss_scale_from_state(const nlohmann::json& state);

}  // namespace mixprec
