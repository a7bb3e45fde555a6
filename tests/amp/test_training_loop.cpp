// The whole mixed-precision loop of README.md ("The mixed-precision step in C++") on a small
// regression problem: FP16 and BF16 with their default loss-scale policies must train like
// FP32.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "amp/grad_scaler.h"
#include "amp/loss_scale.h"
#include "amp/precision.h"
#include "core/generator.h"
#include "core/ops/ops.h"
#include "optim/clip_grad_norm.h"
#include "optim/sgd.h"

namespace mixprec {
namespace {

struct Run {
  std::vector<double> losses;
  int skipped = 0;
  double final_scale = 0.0;
};

// y = tanh(x W1^T + b1) W2^T + b2, fitted to a fixed random teacher of the same shape.
Run train(Precision precision, int steps) {
  Generator gen(21);
  const Tensor x = Tensor::normal({64, 8}, gen);
  const Tensor teacher = Tensor::normal({8, 2}, gen, 0.f, 0.5f);
  const Tensor y = ops::tanh(ops::matmul(x, teacher));

  Generator init(5);
  std::vector<Parameter> params = {
      Parameter("fc1.weight", Tensor::normal({16, 8}, init, 0.f, 0.3f)),
      Parameter("fc1.bias", Tensor::zeros({16})),
      Parameter("fc2.weight", Tensor::normal({2, 16}, init, 0.f, 0.3f)),
      Parameter("fc2.bias", Tensor::zeros({2})),
  };
  PrecisionPolicy policy{precision};
  policy.apply(params);
  SGD sgd(params, {.lr = 0.2, .momentum = 0.9});
  GradScaler scaler(policy.default_loss_scale());

  Run run;
  const Tensor input = x.to(policy.working_dtype());
  for (int i = 0; i < steps; ++i) {
    sgd.zero_grad();
    const Tensor h = ops::tanh(ops::linear(input, params[0].working(), params[1].working()));
    const Tensor pred = ops::linear(h, params[2].working(), params[3].working());
    const Tensor loss = ops::mse_loss(pred.to(DType::F32), y);
    run.losses.push_back(loss.item());
    scaler.scale(loss).backward();
    scaler.unscale(sgd);
    scaler.record_grad_norm(clip_grad_norm(params, 5.0));
    if (scaler.step(sgd).skipped()) ++run.skipped;
    scaler.update();
  }
  run.final_scale = scaler.scale_value();
  return run;
}

TEST_CASE("Training loop: FP16 with dynamic scaling and BF16 track the FP32 loss curve",
          "[amp][training]") {
  const int steps = 150;
  const Run fp32 = train(Precision::FP32, steps);
  const Run fp16 = train(Precision::FP16, steps);
  const Run bf16 = train(Precision::BF16, steps);

  // FP32 learns: the loss falls by at least 10x.
  CHECK(fp32.losses.back() < fp32.losses.front() / 10.0);
  CHECK(fp32.skipped == 0);
  CHECK(bf16.skipped == 0);
  CHECK(bf16.final_scale == 1.0);  // NoLossScale
  // The dynamic scaler starts at 2^16 and may skip a few steps while it finds its level,
  // never most of them, and ends at a finite scale within its bounds.
  CHECK(fp16.skipped < 10);
  CHECK(fp16.final_scale >= 1.0);
  CHECK(fp16.final_scale <= 16777216.0);
  // Same curve within the precision of the working dtype (looser for BF16's 8-bit mantissa).
  const double final32 = fp32.losses.back();
  CHECK(std::abs(fp16.losses.back() - final32) < 0.01 * final32);
  CHECK(std::abs(bf16.losses.back() - final32) < 0.1 * final32);
  CHECK(fp16.losses.back() < fp16.losses.front() / 10.0);
  CHECK(bf16.losses.back() < bf16.losses.front() / 10.0);
}

}  // namespace
}  // namespace mixprec
