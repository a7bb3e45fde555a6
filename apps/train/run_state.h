// What a checkpoint holds besides the weights (state.json), and restoring it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "amp/grad_scaler.h"
#include "apps/config/train_config.h"
#include "core/generator.h"
#include "optim/optimizer.h"

namespace mixprec {

// The settings a resumed run must share with the run that wrote the checkpoint (model, data,
// precision, loss scaling, optimizer, schedule, seed, batch size, accumulation, clipping),
// as YAML text; two configs are compatible when fingerprint_differences finds nothing.
std::string resume_fingerprint(const TrainConfig& config);
// The settings (dotted paths) where a checkpoint's fingerprint `stored` and `config`'s differ,
// compared as settings rather than as text: a setting added to mixprec after the checkpoint
// was written counts as equal while `config` keeps it at its default. Empty: compatible.
std::vector<std::string> fingerprint_differences(const std::string& stored,
                                                 const TrainConfig& config);

struct RunPosition {
  int64_t step = 0;        // optimizer steps done (skipped ones included)
  int64_t next_batch = 0;  // the data position: number of the next training batch
  int64_t skipped_steps = 0;
  double train_seconds = 0.0;  // wall time spent in steps so far
  // The run length a cosine schedule with decay_steps 0 decays over, fixed by the run that
  // started, so that a resumed run keeps the schedule even when it is asked to run longer.
  int64_t schedule_steps = 0;
  // The last finite losses (RunStats::recent_losses), so that summary.json's train_loss of a
  // resumed run is the mean of the same steps as without the interruption (any number;
  // RunStats keeps the last 50). A state.json without them (written before they were kept)
  // restores none.
  std::vector<double> recent_losses;
};

nlohmann::json make_run_state(const TrainConfig& config, const RunPosition& position,
                              const Optimizer& optimizer, const GradScaler& scaler,
                              const Generator& dropout_gen);
// The same with the optimizer's state given (a sharded optimizer's, gathered from its ranks).
nlohmann::json make_run_state(const TrainConfig& config, const RunPosition& position,
                              const OptimizerState& optimizer, const GradScaler& scaler,
                              const Generator& dropout_gen);

// Checks `state` (from `path`) against `config` and restores the optimizer, the scaler and
// the generator; returns the position. Everything is validated before anything changes;
// errors name the file and the field.
RunPosition restore_run_state(const nlohmann::json& state, const std::string& path,
                              const TrainConfig& config, Optimizer& optimizer,
                              GradScaler& scaler, Generator& dropout_gen);

}  // namespace mixprec
