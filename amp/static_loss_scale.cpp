#include "amp/static_loss_scale.h"

#include <cmath>

#include "core/error.h"

namespace mixprec {
namespace {

void check_static_scale(double scale, const char* context) {
  MIXPREC_CHECK(std::isfinite(scale) && scale > 0.0, context, ": scale must be finite and > 0, "
                "got ", scale, "; use a power of two such as 65536 so that unscaling is exact");
}

}  // namespace

StaticLossScale::StaticLossScale(double scale) : scale_(scale) {
  check_static_scale(scale, "StaticLossScale");
}

// The scale never moves. An overflowing step is still skipped by GradScaler; the policy
// absorbs it, which the telemetry records as a tolerated overflow rather than a kept scale.
ScaleChange StaticLossScale::update(bool found_inf) {
  return {scale_, scale_, found_inf ? ScaleEvent::OverflowTolerated : ScaleEvent::Kept};
}

nlohmann::json StaticLossScale::state_dict() const {
  return {{"kind", kind()}, {"scale", scale_}};
}

void StaticLossScale::load_state_dict(const nlohmann::json& state) {
  MIXPREC_CHECK(state.is_object(), "StaticLossScale state must be a JSON object, got ",
                state.type_name());
  const auto kind_it = state.find("kind");
  MIXPREC_CHECK(kind_it != state.end() && kind_it->is_string(), "StaticLossScale state: "
                "missing string field \"kind\" (expected \"static\")");
  const std::string kind = kind_it->get<std::string>();
  MIXPREC_CHECK(kind == "static", "StaticLossScale cannot load a \"", kind, "\" loss-scale "
                "state; build the policy from the state with loss_scale_from_state instead");
  const auto scale_it = state.find("scale");
  MIXPREC_CHECK(scale_it != state.end(), "StaticLossScale state: missing field \"scale\"");
  MIXPREC_CHECK(scale_it->is_number(), "StaticLossScale state: field \"scale\" must be a "
                "number, got ", scale_it->type_name());
  const double scale = scale_it->get<double>();
  check_static_scale(scale, "StaticLossScale state");
  scale_ = scale;
}

std::unique_ptr<LossScalePolicy> StaticLossScale::clone() const {
  return std::make_unique<StaticLossScale>(*this);
}

}  // namespace mixprec
