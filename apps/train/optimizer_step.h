// One optimizer step of a configured run, as `mixprec train` and `mixprec inspect` take it:
// zero the gradients, run each microbatch forward and its scaled loss backward (weighted by
// its share of the step's samples under gradient accumulation), unscale, clip when
// train.clip_grad_norm is set, and queue the update with its skip and the scale update, all
// decided on the device (amp/deferred_steps.h). The host learns the outcome at
// DeferredSteps::resolve(), after this step or after a window of them.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "amp/deferred_steps.h"
#include "apps/data/batch.h"
#include "apps/train/gradient_sync.h"
#include "apps/train/session.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"

namespace mixprec {

// Where a caller looks at or replaces what passes through the step.
struct StepHooks {
  // Each microbatch's loss before it is scaled; returns the loss to scale and backpropagate
  // (the trainer's fault injection and non-finite check). Unset: the loss as computed.
  std::function<Tensor(int64_t micro, const Tensor& loss)> loss;
  // After every backward pass, before unscaling (the trainer's gradient checks).
  std::function<void()> gradients;
  // The hooks do something to this step that a recording of another step would not repeat
  // (an injected fault), so train.cuda_graph takes it eagerly (apps/train/recorded_step.h).
  bool eager_only = false;
};

// Queues the step for `batches` (its microbatches, train.accumulation_steps of them, at
// least one) and returns its loss: an F32 scalar on the device, the microbatch losses weighted
// by their sizes; read it only when needed, since on a GPU reading waits for the device. It
// sets nothing on the optimizer's lr: after resolving, the caller sets
// lr = schedule.lr_at(steps_taken()) when any step was taken.
//
// With `sync` (a data-parallel run), `batches` are this rank's share of the step's
// microbatches, every rank's of one size: each loss is weighted by its share of every rank's
// samples, and after backward the gradients and the loss are summed over the ranks
// (apps/train/gradient_sync.h), before anything reads them.
//
// Dropout: each microbatch draws its masks from its own stream of the session's dropout
// Generator, starting at dropout_stream(batch.number), so the masks of a microbatch depend
// on its number only, not on which rank or which step position takes it.
Tensor take_step(Session& s, Optimizer& optimizer, DeferredSteps& deferred,
                 const LrSchedule& schedule, const std::vector<Batch>& batches,
                 const StepHooks& hooks = {}, GradientSync* sync = nullptr);

// The dropout Generator offset where training batch `number`'s masks start: 2^32 counters a
// microbatch, more than any model here draws (a check says so if one did).
uint64_t dropout_stream(int64_t number);

}  // namespace mixprec
