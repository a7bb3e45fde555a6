// The TensorBoard view of a run's metrics.jsonl: every record the run writes there is written
// into the run folder's event file too, as scalars at the record's step, and flushed, so a
// live `tensorboard --logdir runs` follows the run log step by log step.
//
// Tags, grouped by what they are about (a record's key -> tag; a key that is absent, null or
// not a finite number in the record writes no point):
//   step records: train_loss -> loss/train, lr -> optim/lr, grad_norm -> optim/grad_norm,
//                 scale -> amp/scale, skipped_steps -> amp/skipped, step_ms -> perf/step_ms,
//                 samples_per_s -> perf/samples_per_s, tokens_per_s -> perf/tokens_per_s,
//                 host_syncs_per_step -> perf/host_syncs_per_step
//   eval records: val_loss -> loss/val, val_accuracy -> accuracy/val
// Other records (a stopped run's) write nothing. Values are stored as floats.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/tensorboard/event_file.h"

namespace mixprec::tensorboard {

// The scalars of one metrics.jsonl record, as listed above, in that order.
std::vector<Scalar> metrics_scalars(const nlohmann::json& record);

class MetricsEventLog {
 public:
  // A new event file in `run_dir` for a fresh run: a SessionLog START at step 1, the run's
  // first (TensorBoard only notes it).
  explicit MetricsEventLog(const std::string& run_dir);

  // A new event file in `run_dir` for a run resumed from a checkpoint, with `kept`, the
  // records metrics.jsonl keeps (those up to the checkpoint's step), in file order. The
  // earlier files may hold points after the checkpoint, which the resumed run writes anew,
  // and the file's start makes both of TensorBoard's loaders drop them:
  // - m is the earliest step among the last kept point of each tag (typically the
  //   checkpoint's own log step);
  // - a SessionLog START at m: the Python loader (--load_fast=false) drops every earlier
  //   file's point at steps >= m;
  // - then every kept record at steps >= m again: the data server (the default loader),
  //   which ignores SessionLog, drops a tag's points at or after the step of each new point
  //   of that tag, and both loaders get the kept points back.
  // A tag none of `kept` has a point of keeps the earlier files' points until the resumed
  // run writes one at or before their steps. Without a point in `kept`, the START is at
  // `first_step` (the checkpoint's step + 1) and nothing is written again.
  MetricsEventLog(const std::string& run_dir, int64_t first_step,
                  const std::vector<nlohmann::json>& kept);

  // Writes metrics_scalars(record) at record["step"]. Throws mixprec::Error when the file
  // cannot be written.
  void write(const nlohmann::json& record);

  const std::string& path() const { return file_.path(); }

 private:
  EventFileWriter file_;
};

}  // namespace mixprec::tensorboard
