// End to end on the GPU: the README's mixed-precision loop (Parameter, GradScaler, clip,
// SGD) on cuda:0 follows the CPU's loss curve in FP32, FP16 with dynamic scaling and BF16.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "amp/grad_scaler.h"
#include "amp/loss_scale.h"
#include "amp/precision.h"
#include "core/generator.h"
#include "core/ops/ops.h"
#include "cuda/register.h"
#include "optim/clip_grad_norm.h"
#include "optim/sgd.h"
#include "tests/cuda/backend_agreement.h"

namespace mixprec {
namespace {

struct Curve {
  std::vector<double> losses;
  int skipped = 0;
  uint64_t host_syncs = 0;
};

// Same data and initial weights on either device: they are drawn on the CPU and copied.
Curve train_on(Device device, Precision precision, int steps) {
  Generator gen(21);
  const Tensor x = Tensor::normal({64, 8}, gen);
  const Tensor teacher = Tensor::normal({8, 2}, gen, 0.f, 0.5f);
  const Tensor y = ops::tanh(ops::matmul(x, teacher)).to(device);
  Generator init(5);
  std::vector<Parameter> params = {
      Parameter("fc1.weight", Tensor::normal({16, 8}, init, 0.f, 0.3f).to(device)),
      Parameter("fc1.bias", Tensor::zeros({16}, DType::F32, device)),
      Parameter("fc2.weight", Tensor::normal({2, 16}, init, 0.f, 0.3f).to(device)),
      Parameter("fc2.bias", Tensor::zeros({2}, DType::F32, device)),
  };
  PrecisionPolicy policy{precision};
  policy.apply(params);
  SGD sgd(params, {.lr = 0.2, .momentum = 0.9});
  GradScaler scaler(policy.default_loss_scale());
  const Tensor input = x.to(device).to(policy.working_dtype());

  Curve curve;
  const uint64_t syncs_before = cuda_host_syncs();
  for (int i = 0; i < steps; ++i) {
    sgd.zero_grad();
    const Tensor h = ops::tanh(ops::linear(input, params[0].working(), params[1].working()));
    const Tensor pred = ops::linear(h, params[2].working(), params[3].working());
    const Tensor loss = ops::mse_loss(pred.to(DType::F32), y);
    scaler.scale(loss).backward();
    scaler.unscale(sgd);
    clip_grad_norm(params, 5.0);
    if (scaler.step(sgd).skipped()) ++curve.skipped;
    scaler.update();
    curve.losses.push_back(loss.item());
  }
  curve.host_syncs = cuda_host_syncs() - syncs_before;
  return curve;
}

TEST_CASE("cuda training loop follows the CPU loss curve in every precision", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  const int steps = 60;
  struct Case {
    Precision precision;
    double tolerance;  // relative, on each step's loss
  };
  for (const Case c : {Case{Precision::FP32, 1e-4}, Case{Precision::FP16, 2e-2},
                       Case{Precision::BF16, 5e-2}}) {
    INFO("precision " << precision_name(c.precision));
    const Curve cpu = train_on(kCPU, c.precision, steps);
    const Curve on_gpu = train_on(cuda_test::gpu(), c.precision, steps);
    CHECK(on_gpu.skipped == cpu.skipped);
    for (int i = 0; i < steps; ++i) {
      INFO("step " << i);
      CHECK(on_gpu.losses[i] == Approx(cpu.losses[i]).epsilon(c.tolerance).margin(1e-6));
    }
    CHECK(on_gpu.losses.back() < on_gpu.losses.front() / 5.0);
    // What the loop costs in host round trips today (the scaler reads its flags on the
    // host after each unscale, the loop reads the loss): reported, so a change shows.
    WARN("host syncs per step on the GPU (" << precision_name(c.precision)
                                            << "): " << static_cast<double>(on_gpu.host_syncs) / steps);
  }
}

}  // namespace
}  // namespace mixprec
