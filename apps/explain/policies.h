// `mixprec explain policies`: how each loss-scale policy moves S over the same steps.
//
// The lesson feeds one scripted sequence of per-step overflow flags (found_inf, as
// GradScaler::update would pass it) to the framework's own policies: NoLossScale,
// StaticLossScale, DynamicLossScale with hysteresis 1, and DynamicLossScale with hysteresis 2
// in both HysteresisMode values. A last DynamicLossScale starts one backoff above its floor
// and two growths below its ceiling, and gets its own sequence: a run of overflows, then
// finite steps. Every number shown is read from the policy (scale(), update(),
// growth_tracker(), hysteresis_left()); the rule itself is update_dynamic_scale
// (core/math/amp.h).
#pragma once

#include <string>
#include <vector>

#include "apps/explain/lesson_json.h"

namespace mixprec::explain {

struct PoliciesSetup {
  // ok ok OVF ok OVF ok ok ok OVF OVF ok ok ok: two overflows with a finite step between
  // them (where the hysteresis modes part), then two in a row.
  std::vector<bool> sequence{false, false, true,  false, true,  false, false,
                             false, true,  true,  false, false, false};
  double init_scale = 1024.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int growth_interval = 3;
  int hysteresis = 2;  // for the two hysteresis runs; the plain dynamic run uses 1
  // The floor-and-ceiling run: three overflows, then enough finite steps to reach the ceiling
  // and try to pass it.
  std::vector<bool> floor_sequence{true,  true,  true,  false, false, false,
                                   false, false, false, false, false, false};
  double floor_init_scale = 2.0;
  double floor_min_scale = 1.0;
  double floor_max_scale = 4.0;
};

// One update(found_inf) of a policy.
struct PolicyStep {
  bool overflow = false;     // the found_inf passed to update()
  double scale = 0.0;        // S the step was scaled by (scale() before update)
  std::string event;         // scale_event_name of ScaleChange::event
  double next_scale = 0.0;   // scale() after update
  int growth_tracker = 0;    // after update (0 for a policy without one)
  int hysteresis_left = 0;   // after update (0 for a policy without one)
};

struct PolicyTrace {
  std::string name;      // the JSON key
  std::string settings;  // how the policy was built, for the reader
  std::string notice;    // what the trace shows
  std::vector<PolicyStep> steps;
};

struct PoliciesLesson {
  PoliciesSetup setup;
  PolicyTrace none;             // NoLossScale
  PolicyTrace static_scale;     // StaticLossScale(init_scale)
  PolicyTrace dynamic;          // DynamicLossScale, hysteresis 1
  PolicyTrace reset_on_growth;  // hysteresis `hysteresis`, HysteresisMode::ResetOnGrowth
  PolicyTrace consecutive;      // hysteresis `hysteresis`, HysteresisMode::Consecutive
  PolicyTrace floor_ceiling;    // fed floor_sequence
};

// Runs every policy over its sequence. Throws mixprec::Error for an empty sequence or for
// settings a policy rejects.
PoliciesLesson run_policies_lesson(const PoliciesSetup& setup = {});
std::string policies_text(const PoliciesLesson& lesson);
// Keys: sequence (booleans, true = overflow); then one object per policy, keyed none,
// static, dynamic, hysteresis_reset_on_growth, hysteresis_consecutive, floor_and_ceiling,
// each with settings, scale, event, next_scale, growth_tracker, hysteresis_left (arrays, one
// entry per step) and notice (floor_and_ceiling first has its own sequence); steps (the
// walk-through).
LessonJson policies_json(const PoliciesLesson& lesson);

std::string explain_policies();
LessonJson explain_policies_json();

}  // namespace mixprec::explain
