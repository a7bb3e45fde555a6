// `mixprec explain distributed`: why the ranks of a data-parallel run must agree on a
// non-finite gradient, shown with simulated ranks in one process.
//
// Every rank holds its own copy of the same model, a parameter w (FP32 master, FP16 working
// copy) whose microbatch loss is the FP32 L_r = h_r with the FP16 intermediate
// h_r = rank_grads[r] * w (mul_scalar), so dL_r/dw = rank_grads[r]; its own GradScaler under
// DynamicLossScale and its own SGD. Each step, every rank scales its loss and runs backward
// (the FP16 gradient S * rank_grads[r] is inf where it passes 65504), then GradScaler::step
// and GradScaler::update, in two scenarios:
//   without agreement: each rank unscales, steps and updates from its own gradient;
//   with agreement: before unscale, every rank's gradient buffer becomes the rank-ordered sum
//   of all ranks' buffers (dist::add_in_rank_order, the arithmetic of
//   Communicator::sum_in_rank_order, which the trainer's GradientSync calls). That sum is
//   the trainer's whole agreement: an inf on one rank is an inf in every rank's sum. The
//   ranks' overflow flags are also reduced with dist::max_nan_wins (the arithmetic of
//   Communicator::max), the agreement for a flag where gradients are not summed, and every
//   rank's decision is checked against it.
// The same per-rank gradients are fed at every step.
#pragma once

#include <string>
#include <vector>

#include "apps/explain/lesson_json.h"

namespace mixprec::explain {

struct DistributedSetup {
  // dL/dw of each rank's microbatch (one entry per rank, at least two): each rank's share of
  // the step's gradient, so that the sum over ranks is the step's gradient. Rank 1's passes
  // 65504 at init_scale, rank 0's does not.
  std::vector<double> rank_grads{0.5, 10.0};
  double w_init = 1.0;
  double lr = 0.01;
  double init_scale = 8192.0;
  double backoff_factor = 0.5;
  int growth_interval = 2000;  // no growth within the lesson's steps
  int steps = 3;
};

// One rank in one step.
struct RankStep {
  double scale = 0.0;          // S this rank scaled its loss by
  float own_grad = 0.0f;       // its F32 buffer after its own backward: S * grad via FP16
  float seen_grad = 0.0f;      // what its unscale read: own_grad, or the rank-ordered sum
  float own_flag = 0.0f;       // largest |own_grad| (NaN wins): non-finite means overflow
  bool skipped = false;        // StepResult
  std::string reason;          // StepResult::reason (empty when stepped)
  float w_after = 0.0f;        // its FP32 master after the step
  double next_scale = 0.0;     // after update()
  std::string scale_event;     // StepTelemetry::scale_event
};

struct DistributedStep {
  std::vector<RankStep> ranks;  // in rank order
  float agreed_flag = 0.0f;     // max_nan_wins over the ranks' own_flag (with agreement only)
  bool weights_equal = false;   // every rank's w_after has the same bits
  bool scales_equal = false;    // every rank's next_scale is the same
};

struct DistributedRun {
  bool agreement = false;
  std::vector<DistributedStep> steps;
};

struct DistributedLesson {
  DistributedSetup setup;
  double fp16_max = 0.0;
  DistributedRun without_agreement;
  DistributedRun with_agreement;
};

// Runs both scenarios. Throws mixprec::Error for fewer than two ranks, fewer than one step,
// or a setup the framework rejects; also, as a self-check, if a rank's GradScaler decided
// otherwise than the agreed flag says.
DistributedLesson run_distributed_lesson(const DistributedSetup& setup = {});
std::string distributed_text(const DistributedLesson& lesson);
// Keys: rank_grads, w_init, lr, init_scale, fp16_max; without_agreement and with_agreement,
// each {"agreement", "per_step": [{"step", "agreed_flag" (with agreement), "weights_equal",
// "scales_equal", "ranks": [{"rank", "scale", "own_grad", "seen_grad", "own_flag", "skipped",
// "reason", "w_after", "next_scale", "scale_event"}]}]}; steps (the walk-through). Non-finite
// numbers are the strings "inf", "-inf", "nan".
LessonJson distributed_json(const DistributedLesson& lesson);

std::string explain_distributed();
LessonJson explain_distributed_json();

}  // namespace mixprec::explain
