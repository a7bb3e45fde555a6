// TrainingStopped: a run that stopped itself because it could not make progress
// (train.max_consecutive_skips skipped steps in a row), as opposed to bad input.
//
// Thrown by run_training after it has written a checkpoint of the current state (whose
// weights are those of the last step that was applied: skipped steps do not move them) and
// a metrics.jsonl record {"event": "stopped", ...}. The `mixprec` command line turns it into
// one line "error: <message>" on stderr and exit code 3 (kExitTrainingStopped), so that
// scripts can tell a diverging run from a bad config (2) and a defect (1).
#pragma once

#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace mixprec {

class TrainingStopped : public Error {
 public:
  // `diagnostic`: the "stopped" record written to metrics.jsonl; `checkpoint`: the step_<N>
  // folder written just before.
  TrainingStopped(const std::string& message, nlohmann::json diagnostic, std::string checkpoint)
      : Error(message), diagnostic_(std::move(diagnostic)), checkpoint_(std::move(checkpoint)) {}

  const nlohmann::json& diagnostic() const { return diagnostic_; }
  const std::string& checkpoint() const { return checkpoint_; }

 private:
  nlohmann::json diagnostic_;
  std::string checkpoint_;
};

// The exit code of `mixprec train` for a TrainingStopped.
constexpr int kExitTrainingStopped = 3;

}  // namespace mixprec
