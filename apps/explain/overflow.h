// `mixprec explain overflow`: a scaled gradient overflows FP16, the step is skipped, the
// dynamic loss scale backs off, and after growth_interval good steps it grows again.
//
// The lesson runs the framework itself: a parameter w (FP32 master, FP16 working copy)
// feeds the FP16 intermediate h = grad * w (mul_scalar) and the FP32 loss L = h, so
// dL/dw = grad. Each attempt scales L with GradScaler under DynamicLossScale, runs
// backward (the FP16 gradient S * grad overflows to inf when it passes 65504), then
// GradScaler::step (skipped on a non-finite gradient) and GradScaler::update (the policy
// moves S). There are 1 + growth_interval attempts: the overflow, then enough finite steps
// for one growth.
#pragma once

#include <string>
#include <vector>

#include "apps/explain/lesson_json.h"

namespace mixprec::explain {

struct OverflowSetup {
  double grad = 10.0;  // dL/dw; applied as an FP32 multiplier
  double w_old = 1.0;
  double lr = 0.01;
  double init_scale = 8192.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int growth_interval = 2;
};

// One effective step: scale, backward, unscale, step, update.
struct OverflowAttempt {
  double scale = 0.0;               // S this attempt's loss was scaled by
  double scaled_exact = 0.0;        // S * grad in double, before any rounding
  float scaled_grad = 0.0f;         // the FP16 gradient backward produced (inf on overflow)
  float unscaled_grad = 0.0f;       // after GradScaler::unscale
  bool skipped = false;             // StepResult
  std::string reason;               // StepResult::reason (empty when stepped)
  std::vector<std::string> nonfinite_tensors;
  float w_after = 0.0f;             // the FP32 master after the step
  double next_scale = 0.0;          // after update()
  std::string scale_event;          // StepTelemetry::scale_event
  int growth_tracker = 0;           // after update()
};

struct OverflowLesson {
  OverflowSetup setup;
  double fp16_max = 0.0;
  std::vector<OverflowAttempt> attempts;  // 1 + growth_interval
};

// Runs the attempts. Throws mixprec::Error for a setup the framework rejects.
OverflowLesson run_overflow_lesson(const OverflowSetup& setup = {});
std::string overflow_text(const OverflowLesson& lesson);
// Keys: grad, init_scale, lr, fp16_max, scaled_exact, scaled_grad (the FP16 value, "inf"
// when it overflowed: JSON has no infinity), skipped, skip_reason, w_after_skip,
// scale_after_backoff, scaled_grad_retry, w_after_step, scale_after_growth, attempts (one
// object per attempt with the fields of OverflowAttempt), steps (the walk-through).
LessonJson overflow_json(const OverflowLesson& lesson);

std::string explain_overflow();
LessonJson explain_overflow_json();

}  // namespace mixprec::explain
