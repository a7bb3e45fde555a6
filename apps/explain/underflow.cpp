#include "apps/explain/underflow.h"

#include <cmath>
#include <cstdio>
#include <memory>
#include <utility>
#include <vector>

#include "amp/grad_scaler.h"
#include "amp/no_loss_scale.h"
#include "amp/static_loss_scale.h"
#include "apps/explain/formats.h"
#include "apps/explain/topics.h"
#include "core/error.h"
#include "core/half.h"
#include "core/ops/ops.h"
#include "layers/parameter.h"
#include "optim/sgd.h"

namespace mixprec::explain {
namespace {

// One training step of the toy model under `policy`, with what each stage left behind.
struct StepRun {
  float loss = 0.0f;
  float scaled_loss = 0.0f;
  float grad_before_unscale = 0.0f;
  double grad_scale_tag = 1.0;
  float grad_after_unscale = 0.0f;
  bool stepped = false;
  float w_new = 0.0f;
};

StepRun run_step(const UnderflowSetup& setup, std::unique_ptr<LossScalePolicy> policy) {
  Parameter w("w", Tensor::scalar(setup.w_old));
  w.set_working_dtype(DType::F16);
  SgdOptions options;
  options.lr = setup.lr;
  SGD sgd({w}, options);
  GradScaler scaler(std::move(policy));

  const Tensor h = ops::mul_scalar(w.working(), setup.true_grad);  // the FP16 intermediate
  const Tensor loss = ops::add_scalar(ops::cast(h, DType::F32), setup.loss_at_start);
  const Tensor scaled = scaler.scale(loss);
  scaled.backward();

  StepRun run;
  run.loss = static_cast<float>(loss.item());
  run.scaled_loss = static_cast<float>(scaled.item());
  MIXPREC_CHECK(w.grad().defined(), "explain underflow: backward left no gradient on w");
  run.grad_before_unscale = static_cast<float>(w.grad().item());
  run.grad_scale_tag = w.working().grad_scale();
  scaler.unscale(sgd);
  run.grad_after_unscale = static_cast<float>(w.grad().item());
  run.stepped = scaler.step(sgd).stepped();
  scaler.update();
  run.w_new = static_cast<float>(w.master().item());
  return run;
}

// "0x095E = 0|00010|0101011110": sign, exponent and mantissa joined so that a wrapped line
// never splits them.
std::string fp16_pattern(uint16_t bits) {
  std::string fields = bit_fields(fp16_format(), bits);
  for (char& c : fields) c = c == ' ' ? '|' : c;
  return hex_pattern(fp16_format(), bits) + " = " + fields;
}

std::vector<std::string> underflow_steps(const UnderflowLesson& l) {
  const UnderflowSetup& s = l.setup;
  const FormatLandmarks fp16 = format_landmarks(fp16_format());
  std::vector<std::string> steps;
  steps.push_back(
      "Setup: parameter w with FP32 master " + exact_text(s.w_old) +
      " and an FP16 working copy. The forward pass computes the FP16 intermediate h = " +
      exact_text(l.multiplier) + " * w (the FP32 value of " + shortest_text(s.true_grad) +
      "), and the FP32 loss L = " + shortest_text(s.loss_at_start) + " + h = " +
      exact_text(l.loss) + ". So dL/dw = " + shortest_text(s.true_grad) +
      ", and backward computes it as an FP16 value.");
  const bool lost = l.fp16_unscaled == 0.0f;
  steps.push_back(
      "Step 1, no scaling (NoLossScale): backward takes " + exact_text(l.multiplier) +
      " * 1 in FP32 and rounds it to FP16: " + exact_text(l.fp16_unscaled) + " (" +
      fp16_pattern(l.fp16_unscaled_bits) + ")" +
      (lost ? ". FP16's smallest subnormal is " + exact_text(fp16.smallest_subnormal) +
                  " and the product is at most half of it, so it underflowed to zero"
            : "") +
      ". w's FP32 gradient buffer receives " + exact_text(l.fp16_unscaled) + ", SGD " +
      (l.unscaled_stepped ? "steps" : "skips") + ", and w " + (lost ? "stays " : "becomes ") +
      exact_text(l.w_new_unscaled) + ".");
  const bool normal = std::fabs(l.scaled_exact) >= fp16.smallest_normal;
  steps.push_back("Step 2, scale the loss before backward (S = " + shortest_text(s.scale) +
                  "): GradScaler::scale gives S * L = " + exact_text(l.loss_scaled) +
                  ". The chain rule carries S into every derivative: backward now computes S * " +
                  shortest_text(s.true_grad) + " = " + shortest_text(l.scaled_exact) +
                  " (in exact arithmetic), " + (normal ? "above" : "still below") +
                  " FP16's smallest normal " + exact_text(fp16.smallest_normal) + ".");
  steps.push_back("Step 3, the FP16 rounding of the scaled derivative: backward stores " +
                  exact_text(l.fp16_scaled) + " (" + fp16_pattern(l.fp16_scaled_bits) + ")" +
                  (l.fp16_scaled != 0.0f ? ". Not exact, but not zero" : "") +
                  ". w's FP32 buffer holds it tagged as scaled by " +
                  shortest_text(l.grad_scale_tag) + ".");
  char error[64];
  std::snprintf(error, sizeof error, "%.4g%%", l.relative_error_percent);
  int exponent = 0;
  const bool power_of_two = std::frexp(s.scale, &exponent) == 0.5;
  steps.push_back("Step 4, unscale in FP32 (GradScaler::unscale): " + exact_text(l.fp16_scaled) +
                  " / " + shortest_text(s.scale) + " = " + exact_text(l.restored) +
                  ". The true gradient is " + shortest_text(s.true_grad) +
                  "; the relative error is " + error + ", from the FP16 rounding of step 3" +
                  (power_of_two ? " (dividing by a power of two is exact)." : "."));
  steps.push_back(
      "Step 5, SGD with lr = " + shortest_text(s.lr) + " from w = " + exact_text(s.w_old) +
      ": with scaling w = " + exact_text(l.w_new_scaled) + " (" +
      (l.scaled_stepped ? "stepped" : "skipped") + "; the optimizer works in FP32, with lr "
      "stored as " + exact_text(static_cast<float>(s.lr)) + ", so w is the FP32 value nearest "
      "to -lr * restored = " + exact_text(-s.lr * static_cast<double>(l.restored)) +
      "); exact update in double: " +
      shortest_text(l.w_new_exact) + "; without scaling w = " + exact_text(l.w_new_unscaled) +
      ". The gradient was divided by S before the update, so scaling did not multiply the "
      "learning rate by " + shortest_text(s.scale) + ".");
  return steps;
}

}  // namespace

UnderflowLesson run_underflow_lesson(const UnderflowSetup& setup) {
  UnderflowLesson l;
  l.setup = setup;
  l.multiplier = static_cast<float>(setup.true_grad);

  const StepRun plain = run_step(setup, std::make_unique<NoLossScale>());
  l.loss = plain.loss;
  l.fp16_unscaled = plain.grad_before_unscale;
  l.fp16_unscaled_bits = float_to_half_bits(plain.grad_before_unscale);
  l.unscaled_stepped = plain.stepped;
  l.w_new_unscaled = plain.w_new;

  const StepRun scaled = run_step(setup, std::make_unique<StaticLossScale>(setup.scale));
  l.loss_scaled = scaled.scaled_loss;
  l.scaled_exact = setup.scale * setup.true_grad;
  l.fp16_scaled = scaled.grad_before_unscale;
  l.fp16_scaled_bits = float_to_half_bits(scaled.grad_before_unscale);
  l.grad_scale_tag = scaled.grad_scale_tag;
  l.restored = scaled.grad_after_unscale;
  l.relative_error_percent =
      std::fabs(static_cast<double>(l.restored) - setup.true_grad) / std::fabs(setup.true_grad) * 100.0;
  l.scaled_stepped = scaled.stepped;
  l.w_new_scaled = scaled.w_new;
  l.w_new_exact = setup.w_old - setup.lr * setup.true_grad;
  return l;
}

std::string underflow_text(const UnderflowLesson& lesson) {
  return lesson_text("Loss scaling: saving a tiny FP16 gradient", underflow_steps(lesson));
}

LessonJson underflow_json(const UnderflowLesson& l) {
  LessonJson j = LessonJson::object();
  j["true_grad"] = json_number(l.setup.true_grad);
  j["scale"] = json_number(l.setup.scale);
  j["lr"] = json_number(l.setup.lr);
  j["w_old"] = json_number(l.setup.w_old);
  j["loss"] = json_number(l.loss);
  j["fp16_unscaled"] = json_number(l.fp16_unscaled);
  j["fp16_unscaled_hex"] = hex_pattern(fp16_format(), l.fp16_unscaled_bits);
  j["loss_scaled"] = json_number(l.loss_scaled);
  j["scaled_exact"] = json_number(l.scaled_exact);
  j["fp16_scaled"] = json_number(l.fp16_scaled);
  j["fp16_scaled_hex"] = hex_pattern(fp16_format(), l.fp16_scaled_bits);
  j["restored"] = json_number(l.restored);
  j["relative_error_percent"] = json_number(l.relative_error_percent);
  j["w_new_scaled"] = json_number(l.w_new_scaled);
  j["w_new_unscaled"] = json_number(l.w_new_unscaled);
  j["w_new_exact"] = json_number(l.w_new_exact);
  j["steps"] = underflow_steps(l);
  return j;
}

std::string explain_underflow() { return underflow_text(run_underflow_lesson()); }
LessonJson explain_underflow_json() { return underflow_json(run_underflow_lesson()); }

}  // namespace mixprec::explain
