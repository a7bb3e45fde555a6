#include "apps/train/optimizer_step.h"

#include "apps/train/batch_loss.h"
#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/ops/ops.h"

namespace mixprec {

namespace {

// Each microbatch forward, its loss scaled with its share of the step's samples and
// backward; returns the step's loss (the microbatch losses weighted by their sizes), an F32
// scalar on the device.
Tensor forward_backward(Session& s, DeferredSteps& deferred, const std::vector<Batch>& batches,
                        const StepHooks& hooks, GradientSync* sync) {
  MIXPREC_CHECK(!batches.empty(), "take_step: a step needs at least one batch");
  int64_t samples_per_step = 0;
  for (const Batch& batch : batches) samples_per_step += batch.inputs.size(0);
  if (sync != nullptr) samples_per_step *= sync->ranks();
  const DType working = s.precision.working_dtype();
  Tensor step_loss;
  for (size_t micro = 0; micro < batches.size(); ++micro) {
    const Batch& batch = batches[micro];
    Generator* dropout = s.dropout_gen.get();
    const uint64_t stream = dropout_stream(batch.number);
    if (dropout != nullptr) dropout->set_state(dropout->seed(), stream);
    const BatchLoss computed = batch_loss(*s.model, batch, s.device, working);
    if (sync != nullptr) sync->after_forward();
    MIXPREC_CHECK(dropout == nullptr || dropout->offset() - stream <= dropout_stream(1),
                  "internal: training batch ", batch.number, " drew ", dropout->offset() - stream,
                  " dropout counters, more than its stream holds");
    const Tensor loss =
        hooks.loss ? hooks.loss(static_cast<int64_t>(micro), computed.loss) : computed.loss;
    const double share =
        static_cast<double>(batch.inputs.size(0)) / static_cast<double>(samples_per_step);
    deferred.scale(loss, share).backward();
    NoGradGuard no_grad;
    // A step of one batch: its loss is the step's, and a product by 1 would cost a launch.
    const Tensor weighted = share == 1.0 ? loss.detach() : ops::mul_scalar(loss.detach(), share);
    step_loss = step_loss.defined() ? ops::add(step_loss, weighted) : weighted;
  }
  if (hooks.gradients) hooks.gradients();
  return step_loss;
}

}  // namespace

uint64_t dropout_stream(int64_t number) { return static_cast<uint64_t>(number) << 32; }

Tensor take_step(Session& s, Optimizer& optimizer, DeferredSteps& deferred,
                 const LrSchedule& schedule, const std::vector<Batch>& batches,
                 const StepHooks& hooks, GradientSync* sync) {
  optimizer.zero_grad();
  if (sync != nullptr) sync->begin_step();
  Tensor loss = forward_backward(s, deferred, batches, hooks, sync);
  if (sync != nullptr) {
    sync->reduce_gradients();
    loss = sync->reduce_loss(loss);
  }
  deferred.unscale();
  if (s.config.train.clip_grad_norm > 0.0)
    deferred.clip_grad_norm(s.params, s.config.train.clip_grad_norm);
  deferred.step(&schedule);
  if (sync != nullptr) sync->after_step();
  return loss;
}

}  // namespace mixprec
