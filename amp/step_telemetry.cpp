#include "amp/step_telemetry.h"

#include <cmath>

namespace mixprec {
namespace {

// JSON has no Inf or NaN; the strings keep every line parseable and the value visible.
nlohmann::json number_or_text(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return value;
}

}  // namespace

nlohmann::json StepTelemetry::to_json() const {
  return {{"step", step},
          {"scale", number_or_text(scale)},
          {"next_scale", number_or_text(next_scale)},
          {"scale_event", scale_event},
          {"found_inf", found_inf},
          {"skipped", skipped},
          {"reason", reason},
          {"grad_norm", grad_norm < 0.0 ? nlohmann::json(nullptr) : number_or_text(grad_norm)},
          {"nonfinite_count", nonfinite_tensors.size()},
          {"nonfinite_tensors", nonfinite_tensors},
          {"growth_tracker", growth_tracker},
          {"hysteresis_left", hysteresis_left},
          {"skipped_in_a_row", skipped_in_a_row}};
}

}  // namespace mixprec
