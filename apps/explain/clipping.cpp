#include "apps/explain/clipping.h"

#include <cmath>
#include <memory>

#include "amp/grad_scaler.h"
#include "amp/static_loss_scale.h"
#include "apps/explain/topics.h"
#include "core/error.h"
#include "core/math/amp.h"
#include "core/ops/ops.h"
#include "layers/parameter.h"
#include "optim/clip_grad_norm.h"
#include "optim/sgd.h"

namespace mixprec::explain {
namespace {

double l2_norm(const std::vector<float>& values) {
  double sum = 0.0;
  for (float v : values) sum += static_cast<double>(v) * v;
  return std::sqrt(sum);
}

std::string vector_text(const std::vector<float>& values) {
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i) text += (i ? ", " : "") + exact_text(values[i]);
  return text + "]";
}

// A fresh parameter and the state right after backward from S * sum(p * grad): the
// gradient buffer holds S * grad, tagged as scaled.
struct ScaledBackward {
  Parameter p;
  std::unique_ptr<SGD> sgd;
  std::unique_ptr<GradScaler> scaler;
};

ScaledBackward scaled_backward(const ClippingSetup& setup) {
  const int64_t n = static_cast<int64_t>(setup.grad.size());
  MIXPREC_CHECK(n > 0, "explain clipping: the gradient vector is empty");
  ScaledBackward run;
  run.p = Parameter("p", Tensor::zeros({n}));
  run.p.set_working_dtype(DType::F16);
  run.sgd = std::make_unique<SGD>(std::vector<Parameter>{run.p});
  run.scaler = std::make_unique<GradScaler>(std::make_unique<StaticLossScale>(setup.scale));
  const Tensor c = Tensor::from_vector(setup.grad, {n}, DType::F16);
  const Tensor loss = ops::cast(ops::sum(ops::mul(run.p.working(), c)), DType::F32);
  run.scaler->scale(loss).backward();
  MIXPREC_CHECK(run.p.grad().defined(), "explain clipping: backward left no gradient on p");
  return run;
}

std::vector<std::string> clipping_steps(const ClippingLesson& l) {
  const ClippingSetup& s = l.setup;
  std::vector<std::string> steps;
  steps.push_back("Setup: parameter p (FP32 master, FP16 working copy) with dL/dp = " +
                  vector_text(s.grad) + ", maximum norm " + shortest_text(s.max_norm) +
                  ", loss scale S = " + shortest_text(s.scale) +
                  ". Backward from S * L leaves " + vector_text(l.scaled_grad) +
                  " in p's FP32 gradient buffer, tagged as scaled by S.");
  steps.push_back("clip_grad_norm on the still-scaled gradient is refused: \"" + l.refusal +
                  "\"");
  // The clip factor max_norm / norm, and the one applied with PyTorch's 1e-6 in the
  // denominator, which keeps a zero norm from dividing by zero.
  const std::string clip_action =
      l.true_norm > s.max_norm
          ? ", so the clip factor is max_norm / norm = " + shortest_text(s.max_norm) + "/" +
                shortest_text(l.true_norm) + " = " + shortest_text(l.plain_factor) +
                "; it multiplies by max_norm / (norm + 1e-6) = " + exact_text(l.clip_factor) +
                ", giving "
          : ", within the limit, and leaves it as it is: ";
  steps.push_back("Correct order. GradScaler::unscale gives " + vector_text(l.unscaled_grad) +
                  "; clip_grad_norm measures the norm " + shortest_text(l.true_norm) +
                  clip_action + vector_text(l.correct) + ", norm " +
                  shortest_text(l.correct_norm) + ".");
  steps.push_back("Wrong order (clip_grad_norm with allow_scaled). It measures the scaled "
                  "norm " + shortest_text(l.scaled_norm) + " and clips " +
                  vector_text(l.scaled_grad) + " to " + vector_text(l.clipped_scaled) +
                  "; unscaling then divides by S again: " + vector_text(l.wrong_order) +
                  ", norm " + shortest_text(l.wrong_order_norm) + ": the limit " +
                  shortest_text(s.max_norm) + " was applied to the wrong quantity.");
  steps.push_back("Rule: finish backward, unscale once, clip, then GradScaler::step and "
                  "update.");
  return steps;
}

}  // namespace

ClippingLesson run_clipping_lesson(const ClippingSetup& setup) {
  ClippingLesson l;
  l.setup = setup;

  ScaledBackward right = scaled_backward(setup);
  l.scaled_grad = right.p.grad().to_float_vector();
  try {
    clip_grad_norm({right.p}, setup.max_norm);
  } catch (const Error& e) {
    l.refusal = e.what();
  }
  MIXPREC_CHECK(!l.refusal.empty(),
                "explain clipping: clip_grad_norm accepted a gradient that still carries the "
                "loss scale ", setup.scale);
  right.scaler->unscale(*right.sgd);
  l.unscaled_grad = right.p.grad().to_float_vector();
  l.true_norm = clip_grad_norm({right.p}, setup.max_norm);
  l.clip_factor = clip_coefficient(l.true_norm, setup.max_norm);
  l.plain_factor = l.true_norm > setup.max_norm ? setup.max_norm / l.true_norm : 1.0;
  l.correct = right.p.grad().to_float_vector();
  l.correct_norm = l2_norm(l.correct);
  right.scaler->step(*right.sgd);
  right.scaler->update();

  ScaledBackward wrong = scaled_backward(setup);
  ClipOptions allow_scaled;
  allow_scaled.allow_scaled = true;
  l.scaled_norm = clip_grad_norm({wrong.p}, setup.max_norm, allow_scaled);
  l.clipped_scaled = wrong.p.grad().to_float_vector();
  wrong.scaler->unscale(*wrong.sgd);
  l.wrong_order = wrong.p.grad().to_float_vector();
  l.wrong_order_norm = l2_norm(l.wrong_order);
  return l;
}

std::string clipping_text(const ClippingLesson& lesson) {
  return lesson_text("Loss scaling: unscale before clipping", clipping_steps(lesson));
}

LessonJson clipping_json(const ClippingLesson& l) {
  LessonJson j = LessonJson::object();
  j["grad"] = json_numbers(l.setup.grad);
  j["max_norm"] = json_number(l.setup.max_norm);
  j["scale"] = json_number(l.setup.scale);
  j["scaled_grad"] = json_numbers(l.scaled_grad);
  j["refusal"] = l.refusal;
  j["unscaled_grad"] = json_numbers(l.unscaled_grad);
  j["true_norm"] = json_number(l.true_norm);
  j["clip_factor"] = json_number(l.clip_factor);
  j["plain_factor"] = json_number(l.plain_factor);
  j["correct"] = json_numbers(l.correct);
  j["correct_norm"] = json_number(l.correct_norm);
  j["scaled_norm"] = json_number(l.scaled_norm);
  j["clipped_scaled"] = json_numbers(l.clipped_scaled);
  j["wrong_order"] = json_numbers(l.wrong_order);
  j["wrong_order_norm"] = json_number(l.wrong_order_norm);
  j["steps"] = clipping_steps(l);
  return j;
}

std::string explain_clipping() { return clipping_text(run_clipping_lesson()); }
LessonJson explain_clipping_json() { return clipping_json(run_clipping_lesson()); }

}  // namespace mixprec::explain
