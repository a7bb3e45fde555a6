// The charts of `mixprec bench`: the loss curves of every precision, and the loss scale of
// those that scale (see apps/bench/bench.h for the files).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace mixprec {

struct LossPoint {
  int64_t step = 0;
  double elapsed_s = 0.0;  // training time up to this step (evaluations excluded)
  double loss = 0.0;       // finite
};

struct ScalePoint {
  int64_t step = 0;
  double scale = 1.0;  // the scale the step used
  bool skipped = false;
};

struct PrecisionCurves {
  std::string precision;
  std::vector<LossPoint> loss;    // logged steps with a finite loss, in step order
  bool scales = false;            // its loss-scale policy is not "none"
  std::vector<ScalePoint> scale;  // every step
};

// The finite-loss step records of a run folder's metrics.jsonl ("event": "step", with "step",
// "loss" and "elapsed_s"); non-finite losses are written as strings there and left out here.
std::vector<LossPoint> read_loss_points(const std::string& metrics_path);

// Writes the data files and renders loss.png and scale.png into `out_dir`; what was drawn, or
// why not and how to draw it later, goes to `log`. Returns the PNG file names (relative to
// `out_dir`) that exist afterwards.
std::vector<std::string> draw_bench_charts(const std::string& out_dir, const std::string& name,
                                           const std::vector<PrecisionCurves>& curves,
                                           std::ostream& log);

}  // namespace mixprec
