// `mixprec explain clipping`: why gradients are unscaled before clip_grad_norm.
//
// The lesson runs the framework itself: a parameter p (FP32 master, FP16 working copy) and
// the FP32 loss L = sum(p * c) for a constant FP16 vector c, so dL/dp = c. Backward from
// S * L (GradScaler) leaves S * c in p's FP32 gradient buffer. Then, in the correct order,
// GradScaler::unscale and clip_grad_norm; in the wrong order, clip_grad_norm on the scaled
// gradient (ClipOptions::allow_scaled) and unscale afterwards, which leaves the clipped
// gradient S times shorter than the limit.
#pragma once

#include <string>
#include <vector>

#include "apps/explain/lesson_json.h"

namespace mixprec::explain {

struct ClippingSetup {
  std::vector<float> grad{3.0f, 4.0f};  // dL/dp (exact in FP16)
  double max_norm = 1.0;
  double scale = 16.0;
};

struct ClippingLesson {
  ClippingSetup setup;
  std::vector<float> scaled_grad;     // what backward left in the buffer: S * grad
  std::string refusal;                // clip_grad_norm's message for the still-scaled gradient
  // Correct order: unscale, then clip.
  std::vector<float> unscaled_grad;
  double true_norm = 0.0;             // returned by clip_grad_norm
  double clip_factor = 1.0;           // what clip_grad_norm multiplied by (clip_coefficient)
  double plain_factor = 1.0;          // max_norm / true_norm: the factor without the 1e-6
  std::vector<float> correct;         // the clipped gradient
  double correct_norm = 0.0;          // its L2 norm, in double
  // Wrong order: clip the scaled gradient, then unscale.
  double scaled_norm = 0.0;           // returned by clip_grad_norm: S times the true norm
  std::vector<float> clipped_scaled;  // after clipping, before unscaling
  std::vector<float> wrong_order;     // after unscaling
  double wrong_order_norm = 0.0;      // its L2 norm, in double
};

// Throws mixprec::Error for a setup the framework rejects.
ClippingLesson run_clipping_lesson(const ClippingSetup& setup = {});
std::string clipping_text(const ClippingLesson& lesson);
// Keys: grad, max_norm, scale, scaled_grad, refusal, unscaled_grad, true_norm, clip_factor,
// plain_factor, correct, correct_norm, scaled_norm, clipped_scaled, wrong_order,
// wrong_order_norm (vectors as arrays of numbers), steps (the walk-through).
LessonJson clipping_json(const ClippingLesson& lesson);

std::string explain_clipping();
LessonJson explain_clipping_json();

}  // namespace mixprec::explain
