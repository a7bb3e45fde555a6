// `mixprec train` and `mixprec eval` as library calls.
//
// A run directory holds config.yaml (every setting as given, defaults filled in),
// metrics.jsonl (one JSON object per logged step, every skipped step and every evaluation),
// with log.tensorboard a TensorBoard event file per session holding the same records' scalars
// (apps/tensorboard/metrics_events.h), summary.json (written at the end), and
// checkpoints/step_<N>/{model.safetensors, state.json}. Steps are optimizer steps,
// counted from 1; a skipped step counts as a step (it consumed its batches) but does not
// advance the LR schedule.
//
// Resume (`resume_dir`): continues the run in that directory from its newest checkpoint. The
// checkpoint restores the FP32 masters and buffers, the optimizer's buffers and step count,
// the scaler, the dropout generator, the data position and the recent losses (summary.json's
// train_loss), so on the CPU the weights after N steps are bit-identical to an uninterrupted
// run of N steps. A checkpoint made with another model, data, precision (tf32 included),
// optimizer, loss scaling, seed, batch size or accumulation is refused, naming the settings
// (run_state.h's fingerprint_differences); a setting added to mixprec since the checkpoint
// was written is accepted at its default. The step count, logging, evaluation and checkpoint
// settings may change. Hidden
// folders that a killed save left in checkpoints/ are cleared first (remove_unfinished_saves).
//
// Interrupts (apps/train/interrupt.h): a first SIGINT or SIGTERM lets the step in progress
// finish, with its evaluation and checkpoint if it has them, then saves a checkpoint of that
// step unless it was just saved, and throws TrainingInterrupted (the CLI prints the resume
// command and exits 130 or 143). summary.json is not written: it exists only for a run that
// reached its last step, so its presence means "finished". A signal before training started
// throws before anything is written; one during the last step changes nothing (the run is
// complete). A second signal ends the process at once; the checkpoint being written then is
// left as a hidden temporary folder and the ones before it stay loadable.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mixprec {

// One finished optimizer step, as the loop saw it (for in-process observers such as
// `mixprec bench`). `loss` is NaN unless the loss was read at this step (log steps; every
// step on the CPU when a bar is drawn): reading it waits for the device, so the loop does
// not read it for an observer's sake.
struct StepEvent {
  int64_t step = 0;
  double seconds = 0.0;          // this step's wall time
  double train_seconds = 0.0;    // wall time of every step so far (evaluations and saves excluded)
  double scale = 1.0;            // the loss scale this step used
  double next_scale = 1.0;       // the scale after the policy's update
  bool skipped = false;
  std::string skip_reason;       // empty unless skipped
  double loss = 0.0;             // NaN when not read at this step
};

struct TrainOptions {
  std::string config_path;
  std::vector<std::string> overrides;  // --set key.path=value
  std::string out_dir;     // empty: runs/<name>-<YYYYmmdd-HHMMSS>
  std::string resume_dir;  // empty: a fresh run
  bool progress_bar = false;  // draw a bar (the log stream is a terminal)
  std::function<void(const StepEvent&)> on_step;  // called after every step when set
};

// Trains and returns summary.json's object. Log lines and the bar go to `log`. Throws
// mixprec::Error for bad input (config, data, checkpoint, an out folder that already holds a
// run) before writing anything into the run directory, and TrainingInterrupted after a
// SIGINT or SIGTERM (see above); the handlers for both are installed while it runs. After
// train.max_consecutive_skips skipped steps in a row it saves a checkpoint (the last applied
// step's weights), writes a "stopped" record to metrics.jsonl and throws TrainingStopped
// (apps/train/training_stopped.h) with the non-finite tensors, the scale and min_scale.
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
