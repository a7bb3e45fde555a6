// `mixprec train` and `mixprec eval` as library calls.
//
// A run directory holds config.yaml (the resolved config), metrics.jsonl (one JSON object per
// logged step, every skipped step and every evaluation), summary.json (written at the end),
// and checkpoints/step_<N>/{model.safetensors, state.json}. Steps are optimizer steps,
// counted from 1; a skipped step counts as a step (it consumed its batches) but does not
// advance the LR schedule.
//
// Resume (`resume_dir`): continues the run in that directory from its newest checkpoint. The
// checkpoint restores the FP32 masters and buffers, the optimizer's buffers and step count,
// the scaler, the dropout generator and the data position, so on the CPU the weights after N
// steps are bit-identical to an uninterrupted run of N steps. A checkpoint made with another
// model, data, precision, optimizer, loss scaling, seed, batch size or accumulation is
// refused; the step count, logging, evaluation and checkpoint settings may change.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mixprec {

struct TrainOptions {
  std::string config_path;
  std::vector<std::string> overrides;  // --set key.path=value
  std::string out_dir;     // empty: runs/<name>-<YYYYmmdd-HHMMSS>
  std::string resume_dir;  // empty: a fresh run
  bool progress_bar = false;  // draw a bar (the log stream is a terminal)
};

// Trains and returns summary.json's object. Log lines and the bar go to `log`. Throws
// mixprec::Error for bad input (config, data, checkpoint, an out folder that already holds a
// run) before writing anything into the run directory.
nlohmann::json run_training(const TrainOptions& options, std::ostream& log);

struct EvalOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string checkpoint;  // a step_<N> folder, or a run folder (its newest checkpoint)
};

// {"checkpoint", "step", "split", "loss", "accuracy" (classification), "targets",
// "precision", "device"}.
nlohmann::json run_evaluation(const EvalOptions& options);

}  // namespace mixprec
