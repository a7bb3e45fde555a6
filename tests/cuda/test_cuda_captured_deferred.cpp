// Deferred steps captured into a CUDA graph (cuda/cuda_graph.h, DeferredSteps's replay
// calls): a run that captures one step per window between two resolves and replays it for
// the window's other steps ends with the same weights, scales, skips and norms, bit for bit,
// as the same run taken eagerly; one pool serves every window's graph; and the optimizer
// reports its state unready, so the caller takes the step eagerly, until every buffer a step
// writes exists.
#include <catch2/catch.hpp>

#include <limits>
#include <memory>
#include <vector>

#include "amp/deferred_steps.h"
#include "amp/dynamic_loss_scale.h"
#include "core/generator.h"
#include "core/ops/ops.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_graph.h"
#include "optim/adam.h"
#include "optim/lr_schedule.h"
#include "optim/sgd.h"
#include "tests/cuda/backend_agreement.h"

namespace mixprec {
namespace {

using cuda_test::element_bits;
using cuda_test::gpu;

constexpr int kSteps = 14;
// Resolves after these steps (0-based): windows of 3, 6, 4 and 1 steps.
bool resolves_after(int step) { return step == 2 || step == 8 || step == 12 || step == 13; }

struct Inputs {
  std::vector<Tensor> xs, ys;  // on the CPU
};

// Step 5's input holds an FP16 infinity: that step overflows and is skipped.
Inputs make_inputs() {
  Inputs in;
  for (int step = 0; step < kSteps; ++step) {
    Generator gen(40 + static_cast<uint64_t>(step));
    Tensor x = Tensor::normal({4, 16}, gen);
    if (step == 5) {
      std::vector<float> values = x.to_float_vector();
      values[3] = std::numeric_limits<float>::infinity();
      x = Tensor::from_vector(values, {4, 16});
    }
    in.xs.push_back(x.to(DType::F16));
    in.ys.push_back(Tensor::normal({4, 8}, gen, 0.f, 4.f));
  }
  return in;
}

struct Outcome {
  std::vector<ResolvedStep> resolved;
  std::vector<uint32_t> weight, bias, weight_working;
  int captures = 0;
  int replays = 0;
};

// y = x W^T + b with FP16 working copies, AdamW or SGD with momentum, dynamic loss scaling
// that grows every 2 steps, a warmup-cosine schedule and clipping at 0.25, all deferred.
Outcome run(const Inputs& in, bool capture, bool sgd) {
  Generator gen(5);
  Parameter weight("fc.weight", Tensor::normal({8, 16}, gen, 0.f, 0.5f).to(gpu()));
  Parameter bias("fc.bias", Tensor::normal({8}, gen, 0.f, 0.5f).to(gpu()));
  weight.set_working_dtype(DType::F16);
  bias.set_working_dtype(DType::F16);
  const std::vector<Parameter> params = {weight, bias};
  std::unique_ptr<Optimizer> opt;
  if (sgd) {
    SgdOptions options;
    options.lr = 0.05;
    options.momentum = 0.9;
    opt = std::make_unique<SGD>(params, options);
  } else {
    AdamOptions options;
    options.lr = 0.01;
    opt = std::make_unique<AdamW>(params, options);
  }
  DynamicLossScaleOptions scale;
  scale.init_scale = 512.0;
  scale.growth_interval = 2;
  GradScaler scaler(std::make_unique<DynamicLossScale>(scale));
  const std::unique_ptr<LrSchedule> schedule = make_warmup_cosine_schedule(0.01, 3, kSteps, 0.0);
  DeferredSteps deferred(scaler, *opt);

  const auto step_on = [&](const Tensor& x, const Tensor& y) {
    opt->zero_grad();
    const Tensor pred = ops::linear(x, weight.working(), bias.working());
    deferred.scale(ops::mse_loss(pred.to(DType::F32), y)).backward();
    deferred.unscale();
    deferred.clip_grad_norm(params, 0.25);
    deferred.step(schedule.get());
  };

  auto& backend = dynamic_cast<CudaBackend&>(cuda_test::gpu_backend());
  Outcome out;
  // The graph's fixed inputs, written before each replay.
  Tensor x = Tensor::zeros({4, 16}, DType::F16, gpu()), y = Tensor::zeros({4, 8}, DType::F32, gpu());
  const PrivatePool pool(backend.allocator());
  std::unique_ptr<CudaGraph> graph;
  for (int step = 0; step < kSteps; ++step) {
    if (capture && (graph || opt->buffers_started())) {
      backend.copy_from_host(x.data(), in.xs[step].data(), in.xs[step].nbytes());
      backend.copy_from_host(y.data(), in.ys[step].data(), in.ys[step].nbytes());
      if (graph) {
        graph->replay();
        deferred.add_replayed_step();
        ++out.replays;
      } else {
        graph = std::make_unique<CudaGraph>(backend, [&] { step_on(x, y); }, pool);
        graph->replay();
        deferred.keep_captured_step();
        ++out.captures;
      }
    } else {
      step_on(in.xs[step].to(gpu()), in.ys[step].to(gpu()));
    }
    if (resolves_after(step)) {
      for (ResolvedStep& r : deferred.resolve()) out.resolved.push_back(std::move(r));
      // The window's tables (its rates and step counts) end with it.
      graph.reset();
    }
  }
  out.weight = element_bits(weight.master());
  out.bias = element_bits(bias.master());
  out.weight_working = element_bits(weight.working());
  return out;
}

void expect_same_steps(const Outcome& eager, const Outcome& captured) {
  REQUIRE(captured.resolved.size() == static_cast<size_t>(kSteps));
  REQUIRE(eager.resolved.size() == static_cast<size_t>(kSteps));
  for (int i = 0; i < kSteps; ++i) {
    INFO("step " << i);
    const ResolvedStep &e = eager.resolved[static_cast<size_t>(i)],
                       &c = captured.resolved[static_cast<size_t>(i)];
    CHECK(c.result.outcome == e.result.outcome);
    CHECK(c.result.skipped() == (i == 5));
    CHECK(c.telemetry.scale == e.telemetry.scale);
    CHECK(c.telemetry.next_scale == e.telemetry.next_scale);
    CHECK(c.telemetry.scale_event == e.telemetry.scale_event);
    CHECK(c.telemetry.growth_tracker == e.telemetry.growth_tracker);
    CHECK(c.telemetry.nonfinite_tensors == e.telemetry.nonfinite_tensors);
    CHECK(c.telemetry.step == e.telemetry.step);
    if (i != 5) CHECK(c.telemetry.grad_norm == e.telemetry.grad_norm);
  }
  CHECK(captured.weight == eager.weight);
  CHECK(captured.bias == eager.bias);
  CHECK(captured.weight_working == eager.weight_working);
}

TEST_CASE("cuda deferred AdamW steps captured once per window replay as the eager steps", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  const Inputs in = make_inputs();
  const Outcome eager = run(in, false, false);
  const Outcome captured = run(in, true, false);
  // Step 0 runs eagerly (the moments and the count do not exist yet); each later window
  // captures its first step and replays the rest.
  CHECK(captured.captures == 4);
  CHECK(captured.replays == kSteps - 1 - 4);
  expect_same_steps(eager, captured);
}

TEST_CASE("cuda deferred SGD with momentum captures only once its buffers are confirmed", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  const Inputs in = make_inputs();
  const Outcome eager = run(in, false, true);
  const Outcome captured = run(in, true, true);
  // The momentum buffers started in the first window are confirmed by its resolve: the
  // first window runs eagerly, the later three capture.
  CHECK(captured.captures == 3);
  CHECK(captured.replays == kSteps - 3 - 3);
  expect_same_steps(eager, captured);
}

TEST_CASE("deferred steps refuse replays outside a captured window", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  Parameter weight("w", Tensor::ones({4}, DType::F32, gpu()));
  Adam adam({weight});
  // No update has started the moments: a recording now would create them.
  CHECK_FALSE(adam.buffers_started());
  GradScaler scaler(std::make_unique<DynamicLossScale>(DynamicLossScaleOptions{}));
  DeferredSteps deferred(scaler, adam);
  CHECK_THROWS_WITH(deferred.add_replayed_step(), Catch::Contains("no captured step"));
  CHECK_THROWS_WITH(deferred.keep_captured_step(), Catch::Contains("no step is pending"));
}

}  // namespace
}  // namespace mixprec
