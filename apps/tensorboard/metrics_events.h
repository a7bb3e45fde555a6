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
  // A new event file in `run_dir` for a run whose next step is `first_step` (1 for a fresh
  // run, the checkpoint's step + 1 for a resumed one), starting with a SessionLog START at
  // `first_step`: TensorBoard then drops what an interrupted earlier session wrote at or
  // after that step (the steps metrics.jsonl drops too), and the curve goes on from the
  // checkpoint. A fresh run's START is the run's first, which TensorBoard only notes.
  MetricsEventLog(const std::string& run_dir, int64_t first_step);

  // Writes metrics_scalars(record) at record["step"]. Throws mixprec::Error when the file
  // cannot be written.
  void write(const nlohmann::json& record);

  const std::string& path() const { return file_.path(); }

 private:
  EventFileWriter file_;
};

}  // namespace mixprec::tensorboard
