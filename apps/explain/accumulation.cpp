#include "apps/explain/accumulation.h"

#include <cmath>
#include <cstdio>
#include <memory>

#include "amp/grad_scaler.h"
#include "amp/static_loss_scale.h"
#include "apps/explain/topics.h"
#include "core/error.h"
#include "core/ops/ops.h"
#include "layers/parameter.h"
#include "optim/sgd.h"

namespace mixprec::explain {
namespace {

// The mean loss of one microbatch, whose gradient with respect to w is mean_grad.
Tensor microbatch_loss(const AccumulationSetup& setup, const Parameter& w,
                       const Microbatch& microbatch) {
  const Tensor h = ops::mul_scalar(w.working(), microbatch.mean_grad);  // FP16
  return ops::add_scalar(ops::cast(h, DType::F32), setup.loss_at_start);
}

int64_t total_samples(const std::vector<Microbatch>& microbatches) {
  int64_t total = 0;
  for (const Microbatch& m : microbatches) {
    MIXPREC_CHECK(m.samples >= 1, "explain accumulation: a microbatch needs at least one sample, "
                  "got ", m.samples);
    total += m.samples;
  }
  return total;
}

AccumulationRun run_window(const AccumulationSetup& setup,
                           const std::vector<Microbatch>& microbatches) {
  MIXPREC_CHECK(!microbatches.empty(), "explain accumulation: no microbatches");
  AccumulationRun run;
  run.microbatches = microbatches;
  run.total_samples = total_samples(microbatches);

  Parameter w("w", Tensor::scalar(0.0));
  w.set_working_dtype(DType::F16);
  SGD sgd({w});
  GradScaler scaler(std::make_unique<StaticLossScale>(setup.scale));
  scaler.begin_accumulation(run.total_samples);
  double weighted = 0.0;
  double means = 0.0;
  for (const Microbatch& m : microbatches) {
    const Tensor loss = microbatch_loss(setup, w, m);
    run.losses.push_back(static_cast<float>(loss.item()));
    const Tensor scaled = scaler.scale(loss, m.samples);
    run.scaled_losses.push_back(static_cast<float>(scaled.item()));
    scaled.backward();
    MIXPREC_CHECK(w.grad().defined(), "explain accumulation: backward left no gradient on w");
    run.buffer_after.push_back(static_cast<float>(w.grad().item()));
    weighted += static_cast<double>(m.samples) * m.mean_grad;
    means += m.mean_grad;
  }
  scaler.unscale(sgd);
  run.restored_mean = static_cast<float>(w.grad().item());
  run.stepped = scaler.step(sgd).stepped();
  scaler.update();

  run.expected_mean = weighted / static_cast<double>(run.total_samples);
  run.naive_mean_of_means = means / static_cast<double>(microbatches.size());
  run.relative_error_percent =
      std::fabs(run.restored_mean - run.expected_mean) / std::fabs(run.expected_mean) * 100.0;
  return run;
}

// What GradScaler::update says when called before the window's samples are all in.
std::string update_inside_window(const AccumulationSetup& setup,
                                 const std::vector<Microbatch>& microbatches) {
  Parameter w("w", Tensor::scalar(0.0));
  w.set_working_dtype(DType::F16);
  GradScaler scaler(std::make_unique<StaticLossScale>(setup.scale));
  scaler.begin_accumulation(total_samples(microbatches));
  const Microbatch& first = microbatches.front();
  scaler.scale(microbatch_loss(setup, w, first), first.samples).backward();
  try {
    scaler.update();
  } catch (const Error& e) {
    return e.what();
  }
  MIXPREC_FAIL("explain accumulation: GradScaler::update was accepted inside an unfinished "
               "accumulation window");
}

std::string percent(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g%%", value);
  return text;
}

std::string samples_text(int64_t samples) {
  return std::to_string(samples) + (samples == 1 ? " sample" : " samples");
}

std::string window_text(const char* title, double scale, const AccumulationRun& run) {
  std::string text = std::string(title) + ": " + std::to_string(run.microbatches.size()) +
                     " microbatches, N = " + samples_text(run.total_samples) +
                     ", begin_accumulation(" + std::to_string(run.total_samples) + ").";
  for (size_t i = 0; i < run.microbatches.size(); ++i) {
    const Microbatch& m = run.microbatches[i];
    text += "\n  microbatch " + std::to_string(i + 1) + ": " + samples_text(m.samples) +
            ", mean loss " + exact_text(run.losses[i]) + ", mean gradient " +
            shortest_text(m.mean_grad) + "; scale(L, " + std::to_string(m.samples) +
            ") = L * S * " + std::to_string(m.samples) + "/" +
            std::to_string(run.total_samples) + " = " + exact_text(run.scaled_losses[i]) +
            "; after backward w's buffer holds " + exact_text(run.buffer_after[i]) +
            " (still scaled by S = " + shortest_text(scale) + ")";
  }
  text += "\n  one unscale after the last microbatch: " + exact_text(run.restored_mean) +
          "; the sample-weighted mean (sum of n_i * g_i) / N in double is " +
          shortest_text(run.expected_mean) + " (relative error " +
          percent(run.relative_error_percent) + ", from FP16 rounding); the step " +
          (run.stepped ? "was taken" : "was skipped") + " and update() ran once.";
  return text;
}

std::vector<std::string> accumulation_steps(const AccumulationLesson& l) {
  std::vector<std::string> steps;
  steps.push_back(
      "Setup: parameter w (FP32 master, FP16 working copy); microbatch i has the mean loss "
      "L_i with dL_i/dw = g_i, computed through an FP16 intermediate. One StaticLossScale "
      "S = " + shortest_text(l.setup.scale) + " for the whole effective batch.");
  steps.push_back(window_text("Equal microbatches", l.setup.scale, l.equal));
  steps.push_back(window_text("Unequal microbatches", l.setup.scale, l.unequal) +
                  "\n  averaging the two means instead, as if the microbatches were equal, "
                  "would give " + shortest_text(l.unequal.naive_mean_of_means) +
                  ", not the mean over the samples " +
                  shortest_text(l.unequal.expected_mean) + ".");
  steps.push_back("update() inside the window, after the first microbatch only, is refused: \"" +
                  l.update_inside_window_error + "\"");
  return steps;
}

}  // namespace

AccumulationLesson run_accumulation_lesson(const AccumulationSetup& setup) {
  AccumulationLesson l;
  l.setup = setup;
  MIXPREC_CHECK(setup.unequal.size() >= 2,
                "explain accumulation: the unequal window needs at least two microbatches");
  l.equal = run_window(setup, setup.equal);
  l.unequal = run_window(setup, setup.unequal);
  l.update_inside_window_error = update_inside_window(setup, setup.unequal);
  return l;
}

std::string accumulation_text(const AccumulationLesson& lesson) {
  return lesson_text("Loss scaling with gradient accumulation", accumulation_steps(lesson));
}

LessonJson accumulation_json(const AccumulationLesson& l) {
  LessonJson j = LessonJson::object();
  j["scale"] = json_number(l.setup.scale);
  j["loss"] = json_number(l.setup.loss_at_start);
  j["scaled_losses"] = json_numbers(l.equal.scaled_losses);
  j["restored_mean"] = json_number(l.equal.restored_mean);
  j["expected_mean"] = json_number(l.equal.expected_mean);
  j["buffer_after"] = json_numbers(l.equal.buffer_after);
  j["unequal_restored_mean"] = json_number(l.unequal.restored_mean);
  j["unequal_expected_mean"] = json_number(l.unequal.expected_mean);
  j["naive_mean_of_means"] = json_number(l.unequal.naive_mean_of_means);
  j["unequal_scaled_losses"] = json_numbers(l.unequal.scaled_losses);
  j["unequal_buffer_after"] = json_numbers(l.unequal.buffer_after);
  j["update_inside_window_error"] = l.update_inside_window_error;
  j["steps"] = accumulation_steps(l);
  return j;
}

std::string explain_accumulation() { return accumulation_text(run_accumulation_lesson()); }
LessonJson explain_accumulation_json() {
  return accumulation_json(run_accumulation_lesson());
}

}  // namespace mixprec::explain
