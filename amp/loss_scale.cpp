#include "amp/loss_scale.h"

#include "amp/dynamic_loss_scale.h"
#include "amp/no_loss_scale.h"
#include "amp/static_loss_scale.h"
#include "core/error.h"

namespace mixprec {

FloorPolicy parse_floor_policy(const std::string& text) {
  if (text == "clamp") return FloorPolicy::Clamp;
  if (text == "warn") return FloorPolicy::Warn;
  if (text == "error") return FloorPolicy::Error;
  MIXPREC_FAIL("unknown floor_policy '", text, "': use one of clamp, warn, error");
}

std::string floor_policy_name(FloorPolicy policy) {
  switch (policy) {
    case FloorPolicy::Clamp: return "clamp";
    case FloorPolicy::Warn: return "warn";
    case FloorPolicy::Error: return "error";
  }
  MIXPREC_FAIL("floor_policy_name: invalid FloorPolicy value ", static_cast<int>(policy));
}

HysteresisMode parse_hysteresis_mode(const std::string& text) {
  if (text == "reset_on_growth") return HysteresisMode::ResetOnGrowth;
  if (text == "consecutive") return HysteresisMode::Consecutive;
  MIXPREC_FAIL("unknown hysteresis_mode '", text, "': use one of reset_on_growth, consecutive");
}

std::string hysteresis_mode_name(HysteresisMode mode) {
  switch (mode) {
    case HysteresisMode::ResetOnGrowth: return "reset_on_growth";
    case HysteresisMode::Consecutive: return "consecutive";
  }
  MIXPREC_FAIL("hysteresis_mode_name: invalid HysteresisMode value ", static_cast<int>(mode));
}

std::string scale_event_name(ScaleEvent event) {
  switch (event) {
    case ScaleEvent::Kept: return "kept";
    case ScaleEvent::Grew: return "grew";
    case ScaleEvent::BackedOff: return "backed_off";
    case ScaleEvent::OverflowTolerated: return "overflow_tolerated";
    case ScaleEvent::OverflowAtFloor: return "overflow_at_floor";
  }
  MIXPREC_FAIL("scale_event_name: invalid ScaleEvent value ", static_cast<int>(event));
}

std::unique_ptr<LossScalePolicy> loss_scale_from_state(const nlohmann::json& state) {
  MIXPREC_CHECK(state.is_object(), "loss-scale state must be a JSON object with a \"kind\" "
                "field, got ", state.type_name());
  const auto kind_it = state.find("kind");
  MIXPREC_CHECK(kind_it != state.end(), "loss-scale state has no \"kind\" field: expected "
                "\"static\", \"dynamic\" or \"none\"");
  MIXPREC_CHECK(kind_it->is_string(), "loss-scale state field \"kind\" must be a string, got ",
                kind_it->type_name());
  const std::string kind = kind_it->get<std::string>();
  std::unique_ptr<LossScalePolicy> policy;
  if (kind == "static") {
    policy = std::make_unique<StaticLossScale>(1.0);
  } else if (kind == "dynamic") {
    policy = std::make_unique<DynamicLossScale>();
  } else if (kind == "none") {
    policy = std::make_unique<NoLossScale>();
  } else {
    MIXPREC_FAIL("unknown loss-scale kind '", kind, "': expected static, dynamic or none");
  }
  policy->load_state_dict(state);
  return policy;
}

}  // namespace mixprec
