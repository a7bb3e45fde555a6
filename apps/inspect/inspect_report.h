// The outputs of `mixprec inspect`: inspect.json, summary.txt and the two charts, from what
// was measured.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/inspect/grad_gatherer.h"
#include "apps/inspect/grad_histogram.h"
#include "apps/plot/gnuplot.h"

namespace mixprec::inspect {

// A layer or tensor is at risk when more than this fraction of its non-zero gradient values
// would flush to zero in FP16 without loss scaling.
inline constexpr double kAtRiskFraction = 0.01;

struct InspectFindings {
  std::string config_path;
  std::string name;       // the config's name
  std::string precision;  // fp32 | fp16 | bf16
  std::string device;
  int64_t steps = 0;          // optimizer steps trained before measuring
  int64_t skipped_steps = 0;  // of those, the ones the scaler skipped
  int64_t batches = 0;        // batches whose gradients were gathered
  double scale = 1.0;         // the S of the scaled fractions
  std::string scale_note;     // where S comes from, one sentence
  GatheredGradients gathered;
  ScaleRecommendation recommendation;
};

// inspect.json: {"config", "name", "precision", "device", "steps", "skipped_steps", "batches",
// "scale", "scale_note", "recommended_scale", "recommendation": {"log2", "meets_target",
// "target", "nonzero", "flushed", "overflowed", "representable_fraction"}, "fp16": {"max",
// "min_normal", "min_subnormal"}, "activations": [{"layer", ...}], "weights": [{"tensor",
// ...}], "at_risk": [names]}. Each activation/weight entry: "elements", "zeros", "bins"
// ([{"log2": k, "count": n}] for every k of the histogram), "underflow_bin", "overflow_bin",
// "underflow_fraction_unscaled", "underflow_fraction_scaled", "overflow_fraction_scaled",
// "subnormal_fraction_unscaled".
nlohmann::json inspect_json(const InspectFindings& findings);

// The layers (then tensors) whose underflow_fraction_unscaled exceeds kAtRiskFraction.
std::vector<std::string> at_risk_names(const InspectFindings& findings);

// summary.txt: what was measured, the scale, the layers at risk with their fractions, the
// effect of the current scale and the recommended scale.
std::string inspect_summary(const InspectFindings& findings);

// activation_gradients.{dat,gp,png} and weight_gradients.{dat,gp,png} in `dir`: one line per
// layer (tensor), x = log2 |g| (bin), y = the fraction of its values in that bin, with FP16's
// limits marked for the unscaled values and, dashed, for the values times S. A chart with no
// data to draw is not written (its result says so, rendered false).
std::vector<ChartResult> write_inspect_charts(const std::string& dir,
                                              const InspectFindings& findings);

}  // namespace mixprec::inspect
