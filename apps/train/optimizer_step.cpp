#include "apps/train/optimizer_step.h"

#include "apps/train/batch_loss.h"
#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/ops/ops.h"
#include "optim/clip_grad_norm.h"

namespace mixprec {

StepOutcome take_optimizer_step(Session& s, Optimizer& optimizer, GradScaler& scaler,
                                const LrSchedule& schedule, const std::vector<Batch>& batches,
                                const StepHooks& hooks) {
  MIXPREC_CHECK(!batches.empty(), "take_optimizer_step: a step needs at least one batch");
  const TrainConfig& config = s.config;
  const bool accumulating = batches.size() > 1;
  int64_t samples_per_step = 0;
  for (const Batch& batch : batches) samples_per_step += batch.inputs.size(0);
  const DType working = s.precision.working_dtype();

  StepOutcome out;
  optimizer.zero_grad();
  if (accumulating) scaler.begin_accumulation(samples_per_step);
  for (size_t micro = 0; micro < batches.size(); ++micro) {
    const Batch& batch = batches[micro];
    const BatchLoss computed = batch_loss(*s.model, batch, s.device, working);
    const Tensor loss =
        hooks.loss ? hooks.loss(static_cast<int64_t>(micro), computed.loss) : computed.loss;
    const int64_t samples = batch.inputs.size(0);
    const Tensor scaled = accumulating ? scaler.scale(loss, samples) : scaler.scale(loss);
    scaled.backward();
    NoGradGuard no_grad;
    const Tensor weighted = ops::mul_scalar(
        loss.detach(), static_cast<double>(samples) / static_cast<double>(samples_per_step));
    out.loss = out.loss.defined() ? ops::add(out.loss, weighted) : weighted;
  }
  if (hooks.gradients) hooks.gradients();
  if (config.train.clip_grad_norm > 0.0) {
    scaler.unscale(optimizer);
    scaler.record_grad_norm(clip_grad_norm(s.params, config.train.clip_grad_norm));
  }
  out.result = scaler.step(optimizer);
  out.telemetry = scaler.update();
  if (out.result.stepped()) optimizer.set_lr(schedule.lr_at(optimizer.steps_taken()));
  return out;
}

}  // namespace mixprec
