// Deferred steps on a device: scale, unscale, clip, the optimizer's step and the scale update
// queue without one host read; resolve reads the flags and the norms in two; the outcome
// equals the same deferred steps on the CPU.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "amp/deferred_steps.h"
#include "amp/dynamic_loss_scale.h"
#include "core/generator.h"
#include "core/ops/ops.h"
#include "optim/adam.h"
#include "optim/lr_schedule.h"
#include "tests/cuda/backend_agreement.h"

namespace mixprec {
namespace {

using cuda_test::gpu;

// y = x W^T + b, FP16 working copies, on `device`.
struct DeviceModel {
  Parameter weight, bias;
  explicit DeviceModel(Device device) {
    Generator gen(5);
    weight = Parameter("fc.weight", Tensor::normal({8, 16}, gen, 0.f, 0.5f).to(device));
    bias = Parameter("fc.bias", Tensor::normal({8}, gen, 0.f, 0.5f).to(device));
    weight.set_working_dtype(DType::F16);
    bias.set_working_dtype(DType::F16);
  }
  std::vector<Parameter> params() const { return {weight, bias}; }
};

struct Run {
  std::vector<ResolvedStep> resolved;
  std::vector<float> weight;
  uint64_t syncs_while_queueing = 0;
  uint64_t syncs_to_resolve = 0;
};

// Six deferred steps (the third overflows), each scaled, unscaled, clipped and stepped, then
// one resolve. The inputs are made on the CPU and copied over before the count starts.
Run run_on(Device device) {
  DeviceModel model(device);
  AdamOptions options;
  options.lr = 0.01;
  AdamW opt(model.params(), options);
  DynamicLossScaleOptions scale;
  scale.init_scale = 512.0;
  scale.growth_interval = 2;
  GradScaler scaler(std::make_unique<DynamicLossScale>(scale));
  const std::unique_ptr<LrSchedule> schedule = make_warmup_cosine_schedule(0.01, 2, 6, 0.0);
  DeferredSteps deferred(scaler, opt);
  std::vector<Tensor> xs, ys;
  for (int step = 0; step < 6; ++step) {
    Generator gen(40 + static_cast<uint64_t>(step));
    xs.push_back(Tensor::normal({4, 16}, gen).to(device).to(DType::F16));
    ys.push_back(Tensor::normal({4, 8}, gen, 0.f, 4.f).to(device));
  }
  Run run;
  const bool on_gpu = device.is_cuda();
  const uint64_t before = on_gpu ? cuda_host_syncs() : 0;
  for (int step = 0; step < 6; ++step) {
    opt.zero_grad();
    const Tensor pred = ops::linear(xs[step], model.weight.working(), model.bias.working());
    Tensor loss = ops::mse_loss(pred.to(DType::F32), ys[step]);
    if (step == 2) loss = ops::mul_scalar(loss, std::numeric_limits<double>::infinity());
    deferred.scale(loss).backward();
    deferred.unscale();
    deferred.clip_grad_norm(model.params(), 0.25);
    deferred.step(schedule.get());
  }
  const uint64_t queued = on_gpu ? cuda_host_syncs() : 0;
  run.resolved = deferred.resolve();
  const uint64_t resolved = on_gpu ? cuda_host_syncs() : 0;
  run.syncs_while_queueing = queued - before;
  run.syncs_to_resolve = resolved - queued;
  run.weight = model.weight.master().to_float_vector();
  return run;
}

TEST_CASE("cuda deferred steps queue with no host sync and resolve as on the CPU", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  const Run gpu_run = run_on(gpu());
  const Run cpu_run = run_on(kCPU);
  CHECK(gpu_run.syncs_while_queueing == 0);
  // One read for the six steps' flags, one for their clip norms.
  CHECK(gpu_run.syncs_to_resolve == 2);
  REQUIRE(gpu_run.resolved.size() == 6);
  REQUIRE(cpu_run.resolved.size() == 6);
  for (size_t i = 0; i < 6; ++i) {
    CAPTURE(i);
    CHECK(gpu_run.resolved[i].result.skipped() == (i == 2));
    CHECK(gpu_run.resolved[i].result.outcome == cpu_run.resolved[i].result.outcome);
    CHECK(gpu_run.resolved[i].telemetry.scale == cpu_run.resolved[i].telemetry.scale);
    CHECK(gpu_run.resolved[i].telemetry.scale_event == cpu_run.resolved[i].telemetry.scale_event);
    const double cpu_norm = cpu_run.resolved[i].telemetry.grad_norm;
    const double gpu_norm = gpu_run.resolved[i].telemetry.grad_norm;
    // The overflowing step's norm is not finite on both.
    if (std::isfinite(cpu_norm)) CHECK(gpu_norm == Approx(cpu_norm).epsilon(1e-4));
    else CHECK_FALSE(std::isfinite(gpu_norm));
  }
  REQUIRE(gpu_run.weight.size() == cpu_run.weight.size());
  // FP16 GEMMs may sum in another order on the device: agreement, not identity.
  for (size_t i = 0; i < gpu_run.weight.size(); ++i)
    CHECK(gpu_run.weight[i] == Approx(cpu_run.weight[i]).margin(1e-4).epsilon(1e-3));
}

}  // namespace
}  // namespace mixprec
