// StepTelemetry: one record per effective step, produced by GradScaler::update and written
// by the trainer as one JSONL line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mixprec {

struct StepTelemetry {
  int64_t step = 0;          // effective steps completed before this one (0-based)
  double scale = 1.0;        // the loss scale this step's gradients carried
  double next_scale = 1.0;   // the scale after update()
  std::string scale_event;   // scale_event_name(): "kept", "grew", "backed_off", ...
  bool found_inf = false;    // any checked gradient was non-finite
  bool skipped = false;      // at least one optimizer skipped its update
  std::string reason;        // why (empty when every optimizer stepped)
  double grad_norm = -1.0;   // recorded by GradScaler::record_grad_norm; -1 when not recorded
  std::vector<std::string> nonfinite_tensors;  // names, in parameter order, all optimizers
  int growth_tracker = 0;    // after update()
  int hysteresis_left = 0;   // after update()
  int64_t skipped_in_a_row = 0;  // consecutive skipped effective steps, this one included

  // Keys are the field names above; grad_norm is null when not recorded, non-finite
  // numbers are written as strings ("inf", "nan") so the line stays valid JSON.
  nlohmann::json to_json() const;
};

}  // namespace mixprec
