#include "apps/train/optimizer_step.h"

#include "apps/train/batch_loss.h"
#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/ops/ops.h"
#include "optim/clip_grad_norm.h"

namespace mixprec {

namespace {

// Each microbatch forward, its loss through `scale` (the loss, its sample count, the step's
// sample count) and backward; returns the step's loss (the microbatch losses weighted by
// their sizes), an F32 scalar on the device.
Tensor forward_backward(Session& s, const std::vector<Batch>& batches, const StepHooks& hooks,
                        const std::function<Tensor(const Tensor&, int64_t, int64_t)>& scale) {
  MIXPREC_CHECK(!batches.empty(), "take_optimizer_step: a step needs at least one batch");
  int64_t samples_per_step = 0;
  for (const Batch& batch : batches) samples_per_step += batch.inputs.size(0);
  const DType working = s.precision.working_dtype();
  Tensor step_loss;
  for (size_t micro = 0; micro < batches.size(); ++micro) {
    const Batch& batch = batches[micro];
    const BatchLoss computed = batch_loss(*s.model, batch, s.device, working);
    const Tensor loss =
        hooks.loss ? hooks.loss(static_cast<int64_t>(micro), computed.loss) : computed.loss;
    const int64_t samples = batch.inputs.size(0);
    scale(loss, samples, samples_per_step).backward();
    NoGradGuard no_grad;
    const double share = static_cast<double>(samples) / static_cast<double>(samples_per_step);
    // A step of one batch: its loss is the step's, and a product by 1 would cost a launch.
    const Tensor weighted = share == 1.0 ? loss.detach() : ops::mul_scalar(loss.detach(), share);
    step_loss = step_loss.defined() ? ops::add(step_loss, weighted) : weighted;
  }
  if (hooks.gradients) hooks.gradients();
  return step_loss;
}

}  // namespace

StepOutcome take_optimizer_step(Session& s, Optimizer& optimizer, GradScaler& scaler,
                                const LrSchedule& schedule, const std::vector<Batch>& batches,
                                const StepHooks& hooks) {
  const TrainConfig& config = s.config;
  const bool accumulating = batches.size() > 1;
  StepOutcome out;
  optimizer.zero_grad();
  out.loss = forward_backward(
      s, batches, hooks, [&](const Tensor& loss, int64_t samples, int64_t samples_per_step) {
        if (!accumulating) return scaler.scale(loss);
        if (!scaler.in_accumulation_window()) scaler.begin_accumulation(samples_per_step);
        return scaler.scale(loss, samples);
      });
  if (config.train.clip_grad_norm > 0.0) {
    scaler.unscale(optimizer);
    scaler.record_grad_norm(clip_grad_norm(s.params, config.train.clip_grad_norm));
  }
  out.result = scaler.step(optimizer);
  out.telemetry = scaler.update();
  if (out.result.stepped()) optimizer.set_lr(schedule.lr_at(optimizer.steps_taken()));
  return out;
}

Tensor take_deferred_step(Session& s, Optimizer& optimizer, DeferredSteps& deferred,
                          const LrSchedule& schedule, const std::vector<Batch>& batches,
                          const StepHooks& hooks) {
  optimizer.zero_grad();
  const Tensor loss = forward_backward(
      s, batches, hooks, [&](const Tensor& loss, int64_t samples, int64_t samples_per_step) {
        return deferred.scale(loss, static_cast<double>(samples) /
                                        static_cast<double>(samples_per_step));
      });
  deferred.unscale();
  if (s.config.train.clip_grad_norm > 0.0)
    deferred.clip_grad_norm(s.params, s.config.train.clip_grad_norm);
  deferred.step(&schedule);
  return loss;
}

}  // namespace mixprec
