#include "amp/no_loss_scale.h"

#include "core/error.h"

namespace mixprec {

// S stays 1. A non-finite gradient here is a real Inf/NaN, not a scaling artefact; the step
// is skipped by GradScaler and the policy has nothing to adjust.
ScaleChange NoLossScale::update(bool found_inf) {
  return {1.0, 1.0, found_inf ? ScaleEvent::OverflowTolerated : ScaleEvent::Kept};
}

nlohmann::json NoLossScale::state_dict() const { return {{"kind", kind()}}; }

void NoLossScale::load_state_dict(const nlohmann::json& state) {
  MIXPREC_CHECK(state.is_object(), "NoLossScale state must be a JSON object, got ",
                state.type_name());
  const auto kind_it = state.find("kind");
  MIXPREC_CHECK(kind_it != state.end() && kind_it->is_string(), "NoLossScale state: missing "
                "string field \"kind\" (expected \"none\")");
  const std::string kind = kind_it->get<std::string>();
  MIXPREC_CHECK(kind == "none", "NoLossScale cannot load a \"", kind, "\" loss-scale state; "
                "build the policy from the state with loss_scale_from_state instead");
}

std::unique_ptr<LossScalePolicy> NoLossScale::clone() const {
  return std::make_unique<NoLossScale>(*this);
}

}  // namespace mixprec
