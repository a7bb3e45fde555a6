// `mixprec explain accumulation`: one loss scale for a whole effective batch made of
// several microbatches, and count-weighted losses when microbatches differ in size.
//
// The lesson runs the framework itself: a parameter w (FP32 master, FP16 working copy) and,
// for microbatch i, the FP32 mean loss L_i = loss_at_start + h_i with the FP16 intermediate
// h_i = mean_grad_i * w (mul_scalar), so dL_i/dw = mean_grad_i. GradScaler opens a window of
// N = sum of the sample counts (begin_accumulation) and each microbatch runs backward from
// scale(L_i, n_i) = S * L_i * n_i / N, so the FP16 gradient S * mean_grad_i * n_i / N
// accumulates in w's FP32 buffer; one unscale after the last microbatch restores the
// sample-weighted mean gradient.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "apps/explain/lesson_json.h"

namespace mixprec::explain {

struct Microbatch {
  int64_t samples = 1;
  double mean_grad = 0.0;  // the gradient of the microbatch's mean loss
};

struct AccumulationSetup {
  double scale = 16384.0;  // 2^14: each scaled term is an FP16 normal number
  double loss_at_start = 0.125;  // every microbatch's mean loss at w = 0
  std::vector<Microbatch> equal{{2, 1e-8}, {2, 2e-8}};
  std::vector<Microbatch> unequal{{3, 1e-8}, {1, 2e-8}};
};

struct AccumulationRun {
  std::vector<Microbatch> microbatches;
  int64_t total_samples = 0;
  std::vector<float> losses;              // L_i from the forward pass
  std::vector<float> scaled_losses;       // scale(L_i, n_i) = L_i * S * n_i / N
  std::vector<float> buffer_after;        // w's FP32 buffer (still scaled) after each backward
  float restored_mean = 0.0f;             // after the one unscale
  double expected_mean = 0.0;             // sum(n_i * mean_grad_i) / N, in double
  double naive_mean_of_means = 0.0;       // mean of the mean_grad_i, in double
  double relative_error_percent = 0.0;    // of restored_mean against expected_mean
  bool stepped = false;                   // GradScaler::step after the window
};

struct AccumulationLesson {
  AccumulationSetup setup;
  AccumulationRun equal;
  AccumulationRun unequal;
  std::string update_inside_window_error;  // GradScaler::update's message inside the window
};

// Throws mixprec::Error for a setup the framework rejects.
AccumulationLesson run_accumulation_lesson(const AccumulationSetup& setup = {});
std::string accumulation_text(const AccumulationLesson& lesson);
// Keys: scale, loss; for the equal microbatches scaled_losses, buffer_after, restored_mean,
// expected_mean; for the unequal ones unequal_scaled_losses, unequal_buffer_after,
// unequal_restored_mean, unequal_expected_mean, naive_mean_of_means;
// update_inside_window_error; steps (the walk-through).
LessonJson accumulation_json(const AccumulationLesson& lesson);

std::string explain_accumulation();
LessonJson explain_accumulation_json();

}  // namespace mixprec::explain
