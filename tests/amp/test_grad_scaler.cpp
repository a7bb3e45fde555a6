// GradScaler: the per-optimizer state machine, skips on injected Inf/NaN, shared scales,
// accumulation against one big batch, pass-through when disabled, state round trip.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "amp/dynamic_loss_scale.h"
#include "amp/grad_scaler.h"
#include "amp/no_loss_scale.h"
#include "amp/static_loss_scale.h"
#include "core/error.h"
#include "core/generator.h"
#include "core/ops/ops.h"
#include "optim/clip_grad_norm.h"
#include "optim/sgd.h"
#include "tests/tensor_bytes.h"

#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

namespace mixprec {
namespace {

using Catch::Matchers::Contains;
using mixprec_test::float_bits;

// A linear regression y = x W^T + b with an MSE loss: small, and every parameter gets a
// gradient that depends on every sample.
struct Toy {
  Parameter weight;
  Parameter bias;
  std::vector<Parameter> params() const { return {weight, bias}; }

  explicit Toy(DType working = DType::F32, uint64_t seed = 7) {
    Generator gen(seed);
    weight = Parameter("fc.weight", Tensor::normal({3, 4}, gen, 0.f, 0.5f));
    bias = Parameter("fc.bias", Tensor::normal({3}, gen, 0.f, 0.5f));
    weight.set_working_dtype(working);
    bias.set_working_dtype(working);
  }
  Tensor loss(const Tensor& x, const Tensor& y) const {
    const Tensor pred = ops::linear(x.to(weight.working_dtype()), weight.working(), bias.working());
    return ops::mse_loss(pred.to(DType::F32), y);
  }
};

struct Batch {
  Tensor x, y;
};

Batch make_batch(int64_t rows, uint64_t seed) {
  Generator gen(seed);
  return {Tensor::normal({rows, 4}, gen), Tensor::normal({rows, 3}, gen)};
}

// Rows [start, start + count) of a batch.
Batch rows_of(const Batch& b, int64_t start, int64_t count) {
  return {ops::slice(b.x, 0, start, start + count), ops::slice(b.y, 0, start, start + count)};
}

std::unique_ptr<LossScalePolicy> dynamic(double init, int interval = 2000) {
  DynamicLossScaleOptions options;
  options.init_scale = init;
  options.growth_interval = interval;
  return std::make_unique<DynamicLossScale>(options);
}

TEST_CASE("GradScaler: a clean step unscales by S exactly and steps", "[grad_scaler]") {
  Toy toy;
  const Batch batch = make_batch(8, 1);
  // Reference: the true-scale gradient from an unscaled backward on a copy.
  Toy reference;
  reference.loss(batch.x, batch.y).backward();
  const std::vector<float> true_grad = reference.weight.grad().to_float_vector();

  SGD sgd(toy.params(), {.lr = 0.1});
  GradScaler scaler(dynamic(1024.0));
  scaler.scale(toy.loss(batch.x, batch.y)).backward();
  CHECK(toy.weight.working().grad_scale() == 1024.0);
  scaler.unscale(sgd);
  CHECK(toy.weight.working().grad_scale() == 1.0);
  // A power-of-two scale is undone exactly, so the gradient is the unscaled one bit for bit
  // (the FP32 forward and backward are linear in the scale up to exact power-of-two shifts).
  CHECK(toy.weight.grad().to_float_vector() == true_grad);
  const StepResult result = scaler.step(sgd);
  CHECK(result.stepped());
  CHECK(result.reason.empty());
  CHECK(sgd.steps_taken() == 1);
  const StepTelemetry t = scaler.update();
  CHECK(t.step == 0);
  CHECK(t.scale == 1024.0);
  CHECK(t.next_scale == 1024.0);
  CHECK_FALSE(t.found_inf);
  CHECK_FALSE(t.skipped);
  CHECK(t.growth_tracker == 1);
  CHECK(scaler.effective_steps() == 1);
}

TEST_CASE("GradScaler: every misuse of the state machine throws and says what to do",
          "[grad_scaler]") {
  Toy toy;
  const Batch batch = make_batch(4, 2);
  SGD sgd(toy.params(), {.lr = 0.1});
  GradScaler scaler(dynamic(256.0));

  SECTION("update with no recorded check") {
    CHECK_THROWS_WITH(scaler.update(), Contains("no optimizer was unscaled or stepped") &&
                                           Contains("scaler.step(optimizer)"));
  }
  SECTION("step on gradients that were never scaled") {
    toy.loss(batch.x, batch.y).backward();
    CHECK_THROWS_WITH(scaler.step(sgd), Contains("never scaled") && Contains("scaler.scale(loss)"));
    CHECK(sgd.steps_taken() == 0);
  }
  SECTION("never-scaled gradients are caught even when another loss was scaled") {
    toy.loss(batch.x, batch.y).backward();  // bare loss first: tagged with scale 1
    (void)scaler.scale(toy.loss(batch.x, batch.y));  // scaled, but no backward from it
    CHECK_THROWS_WITH(scaler.unscale(sgd), Contains("'fc.weight' was never scaled"));
  }
  SECTION("unscale twice") {
    scaler.scale(toy.loss(batch.x, batch.y)).backward();
    scaler.unscale(sgd);
    const std::vector<float> once = toy.weight.grad().to_float_vector();
    CHECK_THROWS_WITH(scaler.unscale(sgd), Contains("already unscaled") && Contains("once per optimizer"));
    CHECK(toy.weight.grad().to_float_vector() == once);  // not divided a second time
  }
  SECTION("unscale after step") {
    scaler.scale(toy.loss(batch.x, batch.y)).backward();
    scaler.step(sgd);
    CHECK_THROWS_WITH(scaler.unscale(sgd), Contains("already stepped") && Contains("update()"));
  }
  SECTION("step twice") {
    scaler.scale(toy.loss(batch.x, batch.y)).backward();
    scaler.step(sgd);
    const std::vector<float> after_one = toy.weight.master().to_float_vector();
    CHECK_THROWS_WITH(scaler.step(sgd), Contains("already stepped"));
    CHECK(toy.weight.master().to_float_vector() == after_one);
    CHECK(sgd.steps_taken() == 1);
  }
  SECTION("scale after unscale without update") {
    scaler.scale(toy.loss(batch.x, batch.y)).backward();
    scaler.unscale(sgd);
    CHECK_THROWS_WITH(scaler.scale(toy.loss(batch.x, batch.y)), Contains("call scaler.update()"));
  }
  SECTION("update resets every optimizer to READY") {
    for (int i = 0; i < 3; ++i) {
      sgd.zero_grad();
      scaler.scale(toy.loss(batch.x, batch.y)).backward();
      scaler.unscale(sgd);
      CHECK(scaler.step(sgd).stepped());
      scaler.update();
    }
    CHECK(sgd.steps_taken() == 3);
  }
  SECTION("gradients left over from the previous step carry the old scale") {
    scaler.scale(toy.loss(batch.x, batch.y)).backward();
    scaler.step(sgd);
    scaler.update();  // no zero_grad: the unscaled gradients stay, tagged 1
    CHECK_THROWS_WITH(scaler.scale(toy.loss(batch.x, batch.y)).backward(),
                      Contains("one division could not restore"));
  }
}

TEST_CASE("GradScaler: zero-filled gradient buffers take the next step's scale, whatever it is",
          "[grad_scaler]") {
  Toy toy;
  const Batch batch = make_batch(4, 13);
  SGD sgd(toy.params(), {.lr = 0.01});
  GradScaler scaler(dynamic(64.0));
  for (int i = 0; i < 3; ++i) {
    sgd.zero_grad(/*set_to_none=*/false);
    CHECK(toy.weight.grad().defined() == (i > 0));  // the buffer is kept
    scaler.scale(toy.loss(batch.x, batch.y)).backward();
    CHECK(toy.weight.working().grad_scale() == scaler.scale_value());
    if (i == 1) toy.weight.grad().set(0, std::numeric_limits<float>::infinity());
    CHECK(scaler.step(sgd).stepped() == (i != 1));
    scaler.update();  // 64, then backed off to 32 after the overflow
  }
  CHECK(scaler.scale_value() == 32.0);
  CHECK(sgd.steps_taken() == 2);
}

TEST_CASE("GradScaler: Inf or NaN in any one gradient skips the step and leaves every master "
          "bit-identical", "[grad_scaler]") {
  const Batch batch = make_batch(6, 3);
  for (DType working : {DType::F32, DType::F16}) {
    for (int victim = 0; victim < 2; ++victim) {
      for (float poison : {std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN()}) {
        Toy toy(working);
        SGD sgd(toy.params(), {.lr = 0.1, .momentum = 0.9});
        GradScaler scaler(dynamic(4096.0));
        const auto masters_before = std::vector{float_bits(toy.weight.master()), float_bits(toy.bias.master())};
        const auto working_before = std::vector{float_bits(toy.weight.working()), float_bits(toy.bias.working())};
        scaler.scale(toy.loss(batch.x, batch.y)).backward();
        Parameter target = toy.params()[victim];
        target.grad().set(target.numel() - 1, poison);

        const StepResult result = scaler.step(sgd);
        CHECK(result.skipped());
        REQUIRE(result.nonfinite_tensors == std::vector<std::string>{target.name()});
        CHECK_THAT(result.reason, Contains(target.name()) && Contains("4096"));
        CHECK(sgd.steps_taken() == 0);  // what LR schedules read
        CHECK(float_bits(toy.weight.master()) == masters_before[0]);
        CHECK(float_bits(toy.bias.master()) == masters_before[1]);
        CHECK(float_bits(toy.weight.working()) == working_before[0]);
        CHECK(float_bits(toy.bias.working()) == working_before[1]);
        CHECK_FALSE(sgd.momentum_buffer(0).defined());

        const StepTelemetry t = scaler.update();
        CHECK(t.found_inf);
        CHECK(t.skipped);
        CHECK(t.next_scale == 2048.0);
        CHECK(t.scale_event == "backed_off");
        CHECK(t.nonfinite_tensors == std::vector<std::string>{target.name()});
        CHECK(t.skipped_in_a_row == 1);
        CHECK(scaler.scale_value() == 2048.0);
      }
    }
  }
}

TEST_CASE("GradScaler: a skipped step does not advance the step counter, a good one does",
          "[grad_scaler]") {
  Toy toy;
  const Batch batch = make_batch(4, 4);
  SGD sgd(toy.params(), {.lr = 0.01});
  GradScaler scaler(dynamic(8.0));
  std::vector<bool> stepped;
  for (int i = 0; i < 5; ++i) {
    sgd.zero_grad();
    scaler.scale(toy.loss(batch.x, batch.y)).backward();
    if (i % 2 == 1) toy.bias.grad().set(0, std::numeric_limits<float>::quiet_NaN());
    stepped.push_back(scaler.step(sgd).stepped());
    scaler.update();
  }
  CHECK(stepped == std::vector<bool>{true, false, true, false, true});
  CHECK(sgd.steps_taken() == 3);
  CHECK(scaler.effective_steps() == 5);
}

TEST_CASE("GradScaler: several optimizers share one scale and skip on their own gradients",
          "[grad_scaler]") {
  Toy toy;
  const Batch batch = make_batch(4, 5);
  SGD body(std::vector<Parameter>{toy.weight}, {.lr = 0.1}, "body");
  SGD head(std::vector<Parameter>{toy.bias}, {.lr = 0.1}, "head");
  GradScaler scaler(dynamic(64.0));
  const std::vector<uint32_t> bias_before = float_bits(toy.bias.master());
  const std::vector<uint32_t> weight_before = float_bits(toy.weight.master());
  scaler.scale(toy.loss(batch.x, batch.y)).backward();
  toy.bias.grad().set(1, std::numeric_limits<float>::infinity());
  CHECK(scaler.step(body).stepped());
  const StepResult head_result = scaler.step(head);
  CHECK(head_result.skipped());
  CHECK_THAT(head_result.reason, Contains("optimizer 'head'"));
  CHECK(float_bits(toy.bias.master()) == bias_before);
  CHECK(float_bits(toy.weight.master()) != weight_before);
  CHECK(body.steps_taken() == 1);
  CHECK(head.steps_taken() == 0);
  const StepTelemetry t = scaler.update();
  CHECK(t.found_inf);
  CHECK(t.next_scale == 32.0);  // any overflow backs the shared scale off
  CHECK(t.nonfinite_tensors == std::vector<std::string>{"fc.bias"});
}

// Gradients of the full batch against microbatches of the given sizes under one scale.
void check_accumulation_matches(const std::vector<int64_t>& sizes, DType working, double tolerance) {
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  const Batch batch = make_batch(total, 6);

  Toy whole(working);
  SGD whole_sgd(whole.params(), {.lr = 0.1});
  GradScaler whole_scaler(dynamic(1024.0));
  whole_scaler.scale(whole.loss(batch.x, batch.y)).backward();
  whole_scaler.unscale(whole_sgd);

  Toy parts(working);
  SGD parts_sgd(parts.params(), {.lr = 0.1});
  GradScaler parts_scaler(dynamic(1024.0));
  parts_scaler.begin_accumulation(total);
  int64_t start = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const Batch micro = rows_of(batch, start, sizes[i]);
    parts_scaler.scale(parts.loss(micro.x, micro.y), sizes[i]).backward();
    start += sizes[i];
    if (i + 1 < sizes.size()) {
      CHECK_THROWS_WITH(parts_scaler.unscale(parts_sgd), Contains("inside the accumulation window"));
      CHECK_THROWS_WITH(parts_scaler.step(parts_sgd), Contains("inside the accumulation window"));
      CHECK_THROWS_WITH(parts_scaler.update(), Contains("inside the accumulation window"));
    }
  }
  parts_scaler.unscale(parts_sgd);
  for (size_t p = 0; p < 2; ++p) {
    const std::vector<float> expected = whole.params()[p].grad().to_float_vector();
    const std::vector<float> got = parts.params()[p].grad().to_float_vector();
    REQUIRE(expected.size() == got.size());
    for (size_t i = 0; i < got.size(); ++i)
      CHECK(got[i] == Approx(expected[i]).epsilon(tolerance).margin(tolerance));
  }
  CHECK(parts_scaler.step(parts_sgd).stepped());
  CHECK(parts_scaler.update().scale == 1024.0);
  CHECK_FALSE(parts_scaler.in_accumulation_window());
}

TEST_CASE("GradScaler: accumulation over equal microbatches equals the single big batch",
          "[grad_scaler][accumulation]") {
  check_accumulation_matches({4, 4, 4}, DType::F32, 1e-6);
  check_accumulation_matches({3, 3}, DType::F16, 5e-3);  // FP16 activations: FP16 rounding
}

TEST_CASE("GradScaler: accumulation over unequal microbatches is weighted by their sizes",
          "[grad_scaler][accumulation]") {
  check_accumulation_matches({5, 1, 2}, DType::F32, 1e-6);
  check_accumulation_matches({1, 6}, DType::BF16, 2e-2);
}

TEST_CASE("GradScaler: accumulation window misuse throws", "[grad_scaler][accumulation]") {
  Toy toy;
  const Batch batch = make_batch(4, 7);
  GradScaler scaler(dynamic(16.0));
  CHECK_THROWS_WITH(scaler.scale(toy.loss(batch.x, batch.y), 2), Contains("begin_accumulation"));
  CHECK_THROWS_WITH(scaler.begin_accumulation(0), Contains(">= 1"));
  scaler.begin_accumulation(4);
  CHECK_THROWS_WITH(scaler.begin_accumulation(4), Contains("already open"));
  CHECK_THROWS_WITH(scaler.scale(toy.loss(batch.x, batch.y)), Contains("scale(loss, samples)"));
  CHECK_THROWS_WITH(scaler.scale(toy.loss(batch.x, batch.y), 0), Contains("at least 1"));
  (void)scaler.scale(toy.loss(batch.x, batch.y), 3);
  CHECK_THROWS_WITH(scaler.scale(toy.loss(batch.x, batch.y), 2), Contains("must add up"));
}

TEST_CASE("GradScaler: the microbatch weights and the scale both reach the loss", "[grad_scaler]") {
  GradScaler scaler(std::make_unique<StaticLossScale>(8.0));
  Tensor loss = Tensor::scalar(0.5).set_requires_grad(true);
  scaler.begin_accumulation(4);
  const Tensor scaled = scaler.scale(loss, 1);
  CHECK(scaled.item() == 0.5 * 8.0 / 4.0);
  CHECK(scaled.loss_scale() == 8.0);
  CHECK(loss.loss_scale() == 1.0);  // the caller's loss is never retagged
}

TEST_CASE("GradScaler: a 16-bit loss is scaled in FP32 so S * loss cannot overflow FP16",
          "[grad_scaler]") {
  GradScaler scaler(dynamic(65536.0));
  Tensor loss = Tensor::scalar(4.0, DType::F16).set_requires_grad(true);
  const Tensor scaled = scaler.scale(loss);
  CHECK(scaled.dtype() == DType::F32);
  CHECK(scaled.item() == 262144.0);  // 4 * 65536 > 65504 = FP16 max
}

TEST_CASE("GradScaler: NoLossScale does not multiply but still skips non-finite steps",
          "[grad_scaler]") {
  Toy toy(DType::BF16);
  const Batch batch = make_batch(4, 8);
  SGD sgd(toy.params(), {.lr = 0.1});
  GradScaler scaler(std::make_unique<NoLossScale>());
  const Tensor loss = toy.loss(batch.x, batch.y);
  const Tensor scaled = scaler.scale(loss);
  CHECK(scaled.item() == loss.item());
  scaled.backward();
  toy.weight.grad().set(0, std::numeric_limits<float>::quiet_NaN());
  CHECK(scaler.step(sgd).skipped());
  const StepTelemetry t = scaler.update();
  CHECK(t.scale == 1.0);
  CHECK(t.next_scale == 1.0);
  CHECK(t.nonfinite_tensors == std::vector<std::string>{"fc.weight"});
}

TEST_CASE("GradScaler: enabled=false makes every call a pass-through", "[grad_scaler]") {
  Toy toy;
  const Batch batch = make_batch(4, 9);
  SGD sgd(toy.params(), {.lr = 0.1});
  GradScaler scaler(dynamic(65536.0), /*enabled=*/false);
  CHECK(scaler.scale_value() == 1.0);
  const Tensor loss = toy.loss(batch.x, batch.y);
  const Tensor scaled = scaler.scale(loss);
  CHECK(scaled.is_same(loss));
  scaled.backward();
  toy.weight.grad().set(0, std::numeric_limits<float>::infinity());
  scaler.unscale(sgd);
  scaler.unscale(sgd);  // no state machine
  CHECK(scaler.step(sgd).stepped());  // no check either: the Inf reaches the weights
  CHECK(std::isinf(toy.weight.master().get(0)));
  CHECK(sgd.steps_taken() == 1);
  CHECK(scaler.update().next_scale == 1.0);
  CHECK(scaler.update().step == 1);  // update needs no recorded check when disabled
}

TEST_CASE("GradScaler: floor_policy error stops with the tensors that keep overflowing",
          "[grad_scaler]") {
  DynamicLossScaleOptions options;
  options.init_scale = 2.0;
  options.min_scale = 1.0;
  options.floor_policy = FloorPolicy::Error;
  Toy toy;
  const Batch batch = make_batch(4, 10);
  SGD sgd(toy.params(), {.lr = 0.1});
  GradScaler scaler(std::make_unique<DynamicLossScale>(options));
  auto overflowing_step = [&] {
    sgd.zero_grad();
    scaler.scale(toy.loss(batch.x, batch.y)).backward();
    toy.bias.grad().set(0, std::numeric_limits<float>::infinity());
    CHECK(scaler.step(sgd).skipped());
    return scaler.update();
  };
  CHECK(overflowing_step().next_scale == 1.0);  // 2 -> 1: a backoff, not yet the floor
  const nlohmann::json before = scaler.state_dict();
  CHECK_THROWS_WITH(overflowing_step(), Contains("floor") && Contains("fc.bias (2x)") &&
                                            Contains("floor_policy: error"));
  CHECK(scaler.scale_value() == 1.0);
  CHECK(scaler.policy().state_dict() == before["policy"]);
}

// Collects what spdlog's default logger writes while it is alive.
class CapturedLog {
 public:
  CapturedLog() : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64)),
                  previous_(spdlog::default_logger()) {
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("captured", sink_));
  }
  ~CapturedLog() { spdlog::set_default_logger(previous_); }
  std::vector<std::string> lines() const { return sink_->last_formatted(); }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
  std::shared_ptr<spdlog::logger> previous_;
};

TEST_CASE("GradScaler: floor_policy warn and clamp keep skipping at min_scale, only warn logs",
          "[grad_scaler]") {
  for (FloorPolicy floor : {FloorPolicy::Warn, FloorPolicy::Clamp}) {
    DynamicLossScaleOptions options;
    options.init_scale = 1.0;
    options.floor_policy = floor;
    Toy toy;
    const Batch batch = make_batch(4, 11);
    SGD sgd(toy.params(), {.lr = 0.1});
    GradScaler scaler(std::make_unique<DynamicLossScale>(options));
    CapturedLog log;
    for (int i = 1; i <= 3; ++i) {
      sgd.zero_grad();
      scaler.scale(toy.loss(batch.x, batch.y)).backward();
      toy.weight.grad().set(2, std::numeric_limits<float>::quiet_NaN());
      CHECK(scaler.step(sgd).skipped());
      const StepTelemetry t = scaler.update();
      CHECK(t.scale_event == "overflow_at_floor");
      CHECK(t.next_scale == 1.0);
      CHECK(t.skipped_in_a_row == i);
    }
    const std::vector<std::string> lines = log.lines();
    if (floor == FloorPolicy::Warn) {
      REQUIRE(lines.size() == 3);
      CHECK_THAT(lines[2], Contains("warning") && Contains("fc.weight (3x)") &&
                               Contains("3 overflowing step(s) in a row"));
    } else {
      CHECK(lines.empty());
    }
  }
}

TEST_CASE("GradScaler: a zero-filled gradient that no backward reached is fine at any scale",
          "[grad_scaler]") {
  Parameter used("used", Tensor::ones({3}));
  Parameter unused("unused", Tensor::ones({2}));
  SGD sgd({used, unused}, {.lr = 0.5});
  GradScaler scaler(dynamic(8.0));
  auto run_step = [&](bool touch_unused) {
    sgd.zero_grad(/*set_to_none=*/false);
    Tensor loss = ops::sum(used.working());
    if (touch_unused) loss = loss + ops::sum(unused.working());
    scaler.scale(loss).backward();
    const StepResult result = scaler.step(sgd);
    scaler.update();
    return result;
  };
  CHECK(run_step(true).stepped());
  const std::vector<float> unused_before = unused.master().to_float_vector();
  CHECK(run_step(false).stepped());  // unused holds zeros tagged 1 while S is 8
  CHECK(unused.master().to_float_vector() == unused_before);
  CHECK(used.master().get(0) == 0.0);  // 1 - 0.5 - 0.5
}

TEST_CASE("GradScaler: a scale below 1 that makes an unscaled gradient overflow skips the step",
          "[grad_scaler]") {
  Parameter w("w", Tensor::ones({2}));
  SGD sgd({w}, {.lr = 1.0});
  GradScaler scaler(std::make_unique<StaticLossScale>(0.25));
  // dL/dw = 1e38 * 10 = 1e39, beyond FP32; scaled by 0.25 it is 2.5e38, still finite.
  scaler.scale(ops::sum(ops::mul_scalar(ops::mul_scalar(w.working(), 1e38), 10.0))).backward();
  CHECK(std::isfinite(w.grad().get(0)));
  const StepResult result = scaler.step(sgd);
  CHECK(result.skipped());
  CHECK(result.nonfinite_tensors == std::vector<std::string>{"w"});
  CHECK(w.master().to_float_vector() == std::vector<float>{1.f, 1.f});
}

TEST_CASE("GradScaler: gradients written after unscale are checked again before the step",
          "[grad_scaler]") {
  Parameter w("w", Tensor::ones({2}));
  SGD sgd({w}, {.lr = 0.1});
  GradScaler scaler(dynamic(16.0));
  scaler.scale(ops::sum(w.working())).backward();
  scaler.unscale(sgd);
  // A late backward from an unscaled loss: its tag (1) matches the unscaled buffer.
  ops::sum(ops::mul_scalar(w.working(), std::numeric_limits<double>::infinity())).backward();
  const StepResult result = scaler.step(sgd);
  CHECK(result.skipped());
  CHECK(result.nonfinite_tensors == std::vector<std::string>{"w"});
  CHECK(w.master().to_float_vector() == std::vector<float>{1.f, 1.f});
  CHECK(scaler.update().next_scale == 8.0);
}

TEST_CASE("GradScaler: clipping after unscale is rechecked and still steps", "[grad_scaler]") {
  Toy toy;
  const Batch batch = make_batch(4, 14);
  SGD sgd(toy.params(), {.lr = 0.1});
  GradScaler scaler(dynamic(16.0));
  scaler.scale(toy.loss(batch.x, batch.y)).backward();
  scaler.unscale(sgd);
  clip_grad_norm(toy.params(), 1e-3);
  CHECK(scaler.step(sgd).stepped());
  CHECK(sgd.steps_taken() == 1);
}

TEST_CASE("GradScaler: step with no gradients at all throws", "[grad_scaler]") {
  Toy toy;
  const Batch batch = make_batch(4, 15);
  SGD sgd(toy.params(), {.lr = 0.1});
  GradScaler scaler(dynamic(16.0));
  (void)scaler.scale(toy.loss(batch.x, batch.y));  // backward forgotten
  CHECK_THROWS_WITH(scaler.step(sgd), Contains("has no gradients"));
  CHECK(sgd.steps_taken() == 0);
}

TEST_CASE("GradScaler: an optimizer step that throws is neither counted nor moves the scale",
          "[grad_scaler]") {
  Parameter a("a", Tensor::ones({2}));
  Parameter b("b", Tensor::ones({2}));
  SGD sgd({a, b}, {.lr = 0.5});
  DynamicLossScaleOptions options;
  options.init_scale = 8.0;
  options.growth_interval = 1;
  GradScaler scaler(std::make_unique<DynamicLossScale>(options));
  scaler.scale(ops::sum(a.working())).backward();
  // An F16 gradient: the optimizer needs F32 and refuses before touching any master.
  b.master().set_grad(Tensor::ones({2}, DType::F16));
  b.master().set_grad_scale(8.0);  // as if a scaled backward had written it
  CHECK_THROWS_WITH(scaler.step(sgd), Contains("'b'") && Contains("F32"));
  CHECK(a.master().to_float_vector() == std::vector<float>{1.f, 1.f});
  CHECK(sgd.steps_taken() == 0);
  CHECK_THROWS_WITH(scaler.update(), Contains("step failed") && Contains("not counted"));
  CHECK(scaler.scale_value() == 8.0);
  CHECK(scaler.effective_steps() == 0);
  // The scaler is usable again.
  sgd.zero_grad();
  scaler.scale(ops::sum(a.working())).backward();
  CHECK(scaler.step(sgd).stepped());
  CHECK(scaler.update().next_scale == 16.0);
}

TEST_CASE("GradScaler: state round trip continues the exact scale trajectory", "[grad_scaler]") {
  DynamicLossScaleOptions options;
  options.init_scale = 1024.0;
  options.growth_interval = 3;
  options.hysteresis = 2;
  const std::vector<bool> flags = {false, true, false, false, true, true, false, false, false,
                                   false, true, false, false, false, false};
  const Batch batch = make_batch(4, 12);
  auto run = [&](GradScaler& scaler, size_t from, size_t to) {
    Toy toy;
    SGD sgd(toy.params(), {.lr = 0.0});
    std::vector<StepTelemetry> out;
    for (size_t i = from; i < to; ++i) {
      sgd.zero_grad();
      scaler.scale(toy.loss(batch.x, batch.y)).backward();
      if (flags[i]) toy.weight.grad().set(0, std::numeric_limits<float>::infinity());
      scaler.step(sgd);
      out.push_back(scaler.update());
    }
    return out;
  };
  GradScaler straight(std::make_unique<DynamicLossScale>(options));
  const std::vector<StepTelemetry> expected = run(straight, 0, flags.size());

  GradScaler first(std::make_unique<DynamicLossScale>(options));
  run(first, 0, 7);
  const std::string saved = first.state_dict().dump();
  GradScaler resumed(std::make_unique<DynamicLossScale>(DynamicLossScaleOptions{}));
  resumed.load_state_dict(nlohmann::json::parse(saved));
  const std::vector<StepTelemetry> rest = run(resumed, 7, flags.size());
  for (size_t i = 0; i < rest.size(); ++i) {
    const StepTelemetry& want = expected[7 + i];
    CHECK(rest[i].step == want.step);
    CHECK(rest[i].scale == want.scale);
    CHECK(rest[i].next_scale == want.next_scale);
    CHECK(rest[i].growth_tracker == want.growth_tracker);
    CHECK(rest[i].hysteresis_left == want.hysteresis_left);
    CHECK(rest[i].skipped_in_a_row == want.skipped_in_a_row);
  }
}

TEST_CASE("GradScaler: a malformed or mismatched state is refused and changes nothing",
          "[grad_scaler]") {
  GradScaler scaler(dynamic(512.0));
  const nlohmann::json good = scaler.state_dict();
  nlohmann::json missing = good;
  missing.erase("effective_steps");
  CHECK_THROWS_WITH(scaler.load_state_dict(missing), Contains("'effective_steps'"));
  nlohmann::json wrong_kind = good;
  wrong_kind["policy"] = StaticLossScale(4.0).state_dict();
  CHECK_THROWS_WITH(scaler.load_state_dict(wrong_kind), Contains("'static'") && Contains("'dynamic'"));
  nlohmann::json negative = good;
  negative["skipped_in_a_row"] = -1;
  CHECK_THROWS_WITH(scaler.load_state_dict(negative), Contains("skipped_in_a_row"));
  nlohmann::json numeric_kind = good;
  numeric_kind["policy"]["kind"] = 7;
  CHECK_THROWS_AS(scaler.load_state_dict(numeric_kind), Error);
  GradScaler disabled(dynamic(512.0), false);
  CHECK_THROWS_WITH(disabled.load_state_dict(good), Contains("enabled"));
  CHECK(scaler.state_dict() == good);
  Tensor loss = Tensor::scalar(1.0).set_requires_grad(true);
  (void)scaler.scale(loss);  // a step has started: the scale may not change under it
  CHECK_THROWS_WITH(scaler.load_state_dict(good), Contains("a step is in progress"));
}

TEST_CASE("StepTelemetry: one JSON object with every field, non-finite numbers as strings",
          "[grad_scaler]") {
  StepTelemetry t;
  t.step = 3;
  t.scale = 32768.0;
  t.next_scale = 16384.0;
  t.scale_event = "backed_off";
  t.found_inf = true;
  t.skipped = true;
  t.reason = "non-finite";
  t.grad_norm = std::numeric_limits<double>::infinity();
  t.nonfinite_tensors = {"a", "b"};
  t.growth_tracker = 0;
  t.hysteresis_left = 1;
  t.skipped_in_a_row = 2;
  const nlohmann::json j = nlohmann::json::parse(t.to_json().dump());
  CHECK(j["step"] == 3);
  CHECK(j["scale"] == 32768.0);
  CHECK(j["next_scale"] == 16384.0);
  CHECK(j["found_inf"] == true);
  CHECK(j["skipped"] == true);
  CHECK(j["grad_norm"] == "inf");
  CHECK(j["nonfinite_count"] == 2);
  CHECK(j["nonfinite_tensors"] == nlohmann::json::array({"a", "b"}));
  CHECK(j["growth_tracker"] == 0);
  CHECK(j["hysteresis_left"] == 1);
  CHECK(j["skipped_in_a_row"] == 2);
  t.grad_norm = -1.0;
  CHECK(t.to_json()["grad_norm"].is_null());
}

}  // namespace
}  // namespace mixprec
