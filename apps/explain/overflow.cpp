#include "apps/explain/overflow.h"

#include <cmath>
#include <memory>
#include <utility>

#include "amp/dynamic_loss_scale.h"
#include "amp/grad_scaler.h"
#include "apps/explain/formats.h"
#include "apps/explain/topics.h"
#include "core/error.h"
#include "core/ops/ops.h"
#include "layers/parameter.h"
#include "optim/sgd.h"

namespace mixprec::explain {
namespace {

std::string attempt_text(const OverflowSetup& s, const OverflowAttempt& a, size_t index,
                         double fp16_max) {
  std::string text = "Attempt " + std::to_string(index + 1) + " (S = " + shortest_text(a.scale) +
                     "): backward computes S * " + shortest_text(s.grad) + " = " +
                     shortest_text(a.scaled_exact) + " and stores it in FP16 as " +
                     exact_text(a.scaled_grad);
  if (a.skipped) {
    if (std::isinf(a.scaled_grad)) {
      text += " (past FP16's largest finite value " + exact_text(fp16_max) +
              " by more than half a step, so it rounds to infinity)";
    }
    text += ". GradScaler::unscale finds it non-finite";
    if (!a.nonfinite_tensors.empty()) {
      text += " in";
      for (const std::string& name : a.nonfinite_tensors) text += " '" + name + "'";
    }
    text += ", so step() skips the update (\"" + a.reason + "\") and w stays " +
            exact_text(a.w_after) + ".";
  } else {
    text += ", finite. Unscaled: " + exact_text(a.unscaled_grad) + "; SGD steps: w = " +
            exact_text(a.w_after) + ".";
  }
  text += " update(): " + a.scale_event + ", S " + shortest_text(a.scale) + " -> " +
          shortest_text(a.next_scale);
  if (a.scale_event == "kept") {
    text += " (" + std::to_string(a.growth_tracker) + " of " +
            std::to_string(s.growth_interval) + " finite steps towards growth)";
  }
  return text + ".";
}

std::vector<std::string> overflow_steps(const OverflowLesson& l) {
  const OverflowSetup& s = l.setup;
  std::vector<std::string> steps;
  steps.push_back(
      "Setup: parameter w with FP32 master " + exact_text(s.w_old) +
      " and an FP16 working copy; the FP16 intermediate h = " + shortest_text(s.grad) +
      " * w and the FP32 loss L = h, so dL/dw = " + shortest_text(s.grad) +
      ". DynamicLossScale: init " + shortest_text(s.init_scale) + ", growth_factor " +
      shortest_text(s.growth_factor) + ", backoff_factor " + shortest_text(s.backoff_factor) +
      ", growth_interval " + std::to_string(s.growth_interval) + "; SGD with lr " +
      shortest_text(s.lr) + ".");
  for (size_t i = 0; i < l.attempts.size(); ++i) {
    steps.push_back(attempt_text(s, l.attempts[i], i, l.fp16_max));
  }
  steps.push_back(
      "A skipped step leaves the weights untouched instead of writing inf into them; the "
      "backoff makes the next attempt fit, and growth probes for a larger scale again.");
  return steps;
}

}  // namespace

OverflowLesson run_overflow_lesson(const OverflowSetup& setup) {
  MIXPREC_CHECK(setup.growth_interval >= 1 && setup.growth_interval <= 1000,
                "explain overflow: growth_interval must be in [1, 1000], got ",
                setup.growth_interval);
  OverflowLesson l;
  l.setup = setup;
  l.fp16_max = format_landmarks(fp16_format()).largest_finite;

  Parameter w("w", Tensor::scalar(setup.w_old));
  w.set_working_dtype(DType::F16);
  SgdOptions sgd_options;
  sgd_options.lr = setup.lr;
  SGD sgd({w}, sgd_options);
  DynamicLossScaleOptions scale_options;
  scale_options.init_scale = setup.init_scale;
  scale_options.growth_factor = setup.growth_factor;
  scale_options.backoff_factor = setup.backoff_factor;
  scale_options.growth_interval = setup.growth_interval;
  GradScaler scaler(std::make_unique<DynamicLossScale>(scale_options));

  for (int i = 0; i < 1 + setup.growth_interval; ++i) {
    OverflowAttempt a;
    a.scale = scaler.scale_value();
    a.scaled_exact = a.scale * setup.grad;
    sgd.zero_grad();
    const Tensor loss = ops::cast(ops::mul_scalar(w.working(), setup.grad), DType::F32);
    scaler.scale(loss).backward();
    MIXPREC_CHECK(w.grad().defined(), "explain overflow: backward left no gradient on w");
    a.scaled_grad = static_cast<float>(w.grad().item());
    scaler.unscale(sgd);
    a.unscaled_grad = static_cast<float>(w.grad().item());
    const StepResult result = scaler.step(sgd);
    a.skipped = result.skipped();
    a.reason = result.reason;
    a.nonfinite_tensors = result.nonfinite_tensors;
    a.w_after = static_cast<float>(w.master().item());
    const StepTelemetry telemetry = scaler.update();
    a.next_scale = telemetry.next_scale;
    a.scale_event = telemetry.scale_event;
    a.growth_tracker = telemetry.growth_tracker;
    l.attempts.push_back(std::move(a));
  }
  return l;
}

std::string overflow_text(const OverflowLesson& lesson) {
  return lesson_text("Loss scaling: overflow, a skipped step, backoff and growth", overflow_steps(lesson));
}

LessonJson overflow_json(const OverflowLesson& l) {
  MIXPREC_CHECK(l.attempts.size() >= 2, "explain overflow: the lesson has ", l.attempts.size(),
                " attempts; it needs an overflow and a retry");
  const OverflowAttempt& first = l.attempts.front();
  const OverflowAttempt& retry = l.attempts[1];
  LessonJson j = LessonJson::object();
  j["grad"] = json_number(l.setup.grad);
  j["init_scale"] = json_number(l.setup.init_scale);
  j["lr"] = json_number(l.setup.lr);
  j["fp16_max"] = json_number(l.fp16_max);
  j["scaled_exact"] = json_number(first.scaled_exact);
  j["scaled_grad"] = json_number(first.scaled_grad);
  j["skipped"] = first.skipped;
  j["skip_reason"] = first.reason;
  j["w_after_skip"] = json_number(first.w_after);
  j["scale_after_backoff"] = json_number(first.next_scale);
  j["scaled_grad_retry"] = json_number(retry.scaled_grad);
  j["w_after_step"] = json_number(retry.w_after);
  j["scale_after_growth"] = json_number(l.attempts.back().next_scale);
  LessonJson attempts = LessonJson::array();
  for (const OverflowAttempt& a : l.attempts) {
    attempts.push_back({{"scale", json_number(a.scale)},
                        {"scaled_exact", json_number(a.scaled_exact)},
                        {"scaled_grad", json_number(a.scaled_grad)},
                        {"unscaled_grad", json_number(a.unscaled_grad)},
                        {"skipped", a.skipped},
                        {"reason", a.reason},
                        {"nonfinite_tensors", a.nonfinite_tensors},
                        {"w_after", json_number(a.w_after)},
                        {"next_scale", json_number(a.next_scale)},
                        {"scale_event", a.scale_event},
                        {"growth_tracker", a.growth_tracker}});
  }
  j["attempts"] = std::move(attempts);
  j["steps"] = overflow_steps(l);
  return j;
}

std::string explain_overflow() { return overflow_text(run_overflow_lesson()); }
LessonJson explain_overflow_json() { return overflow_json(run_overflow_lesson()); }

}  // namespace mixprec::explain
