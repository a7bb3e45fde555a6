// `mixprec explain underflow`: a gradient too small for FP16 is lost in an FP16 backward
// step, and loss scaling saves it (the worked example of Micikevicius et al.'s loss scaling:
// true gradient 1e-8, S = 2^14, SGD with lr 0.1).
//
// The lesson runs the framework itself. A parameter w (FP32 master, FP16 working copy) feeds
// an FP16 intermediate h = true_grad * w (mul_scalar: the product is taken in FP32 and
// rounded once to FP16, forward and backward alike), and the loss is
// L = loss_at_start + h in FP32, so dL/dw = true_grad. Backward from S * L (GradScaler)
// computes the FP16 gradient S * true_grad, which lands widened in w's FP32 gradient
// buffer; GradScaler unscales it and SGD steps. The same run without scaling (NoLossScale)
// shows what arrives otherwise.
#pragma once

#include <cstdint>
#include <string>

#include "apps/explain/lesson_json.h"

namespace mixprec::explain {

struct UnderflowSetup {
  double true_grad = 1e-8;     // dL/dw; applied as an FP32 multiplier
  double loss_at_start = 0.125;
  double w_old = 0.0;
  double scale = 16384.0;      // 2^14
  double lr = 0.1;
};

struct UnderflowLesson {
  UnderflowSetup setup;
  float multiplier = 0.0f;      // true_grad as FP32, the value mul_scalar applies
  float loss = 0.0f;            // L at w_old, from the forward pass
  // Without scaling: the gradient that reached w's buffer, and w after the step.
  float fp16_unscaled = 0.0f;
  uint16_t fp16_unscaled_bits = 0;
  bool unscaled_stepped = false;
  float w_new_unscaled = 0.0f;
  // With scaling.
  float loss_scaled = 0.0f;     // GradScaler::scale(L)
  double scaled_exact = 0.0;    // S * true_grad in double, before any rounding
  float fp16_scaled = 0.0f;     // the FP16 gradient S * true_grad that backward produced
  uint16_t fp16_scaled_bits = 0;
  double grad_scale_tag = 0.0;  // the scale the buffer was tagged with before unscale
  float restored = 0.0f;        // after GradScaler::unscale
  double relative_error_percent = 0.0;  // |restored - true_grad| / true_grad * 100, in double
  bool scaled_stepped = false;
  float w_new_scaled = 0.0f;
  double w_new_exact = 0.0;     // w_old - lr * true_grad, in double
};

// Runs both training steps. Throws mixprec::Error for a setup the framework rejects.
UnderflowLesson run_underflow_lesson(const UnderflowSetup& setup = {});
std::string underflow_text(const UnderflowLesson& lesson);
// Keys: true_grad, scale, lr, w_old, loss, fp16_unscaled, fp16_unscaled_hex, loss_scaled,
// scaled_exact, fp16_scaled, fp16_scaled_hex ("0x095E"), restored, relative_error_percent,
// w_new_scaled, w_new_unscaled, w_new_exact, and steps (the walk-through, one string a
// step). Numbers are JSON numbers (json_number).
LessonJson underflow_json(const UnderflowLesson& lesson);

std::string explain_underflow();
LessonJson explain_underflow_json();

}  // namespace mixprec::explain
