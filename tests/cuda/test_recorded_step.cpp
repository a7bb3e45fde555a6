// RecordedStep (apps/train/recorded_step.h) on its own, with a small GPT on cuda:0: which
// steps it records or replays and which it hands back to the caller to take eagerly (nullopt):
// a step before the optimizer's buffers exist, a step whose hooks say eager_only, and a step
// whose token ids are out of the data's range, of unknown range, or from data that gives no
// range. A step it hands back ends the window, so the next one records anew.
#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "amp/deferred_steps.h"
#include "amp/grad_scaler.h"
#include "apps/train/optimizer_step.h"
#include "apps/train/recorded_step.h"
#include "apps/train/session.h"
#include "apps/train/training_setup.h"
#include "core/backend.h"
#include "tests/cuda/backend_agreement.h"
#include "tests/cuda/train_run_support.h"

namespace mixprec {
namespace {

using namespace cuda_train_test;

// The objects the trainer builds around a RecordedStep, for gpt_shakespeare.yaml made small.
struct Rig {
  explicit Rig(const std::vector<std::string>& overrides)
      : s(open_session(config_path("gpt_shakespeare.yaml"), with(overrides, {"device=cuda"}))),
        optimizer(make_optimizer(s.config, s.params)),
        scaler(make_loss_scale_policy(s.config)),
        schedule(make_schedule(s.config, 100)),
        deferred(scaler, *optimizer),
        recorded(s, *optimizer, deferred, *schedule, backend_for(s.device).make_step_graphs()) {}

  // Training batch `number` on the device, its ids uploaded from the host (bounds known).
  std::vector<Batch> batches(int64_t number) const {
    Batch batch = s.data->train_batch(number);
    batch.inputs = batch.inputs.to(s.device);
    batch.targets = batch.targets.to(s.device);
    return {batch};
  }

  Session s;
  std::unique_ptr<Optimizer> optimizer;
  GradScaler scaler;
  std::unique_ptr<LrSchedule> schedule;
  DeferredSteps deferred;
  RecordedStep recorded;
};

// `ids` (I32, on the device) with element 0 set to `value`, uploaded from the host.
Tensor with_first_id(const Tensor& ids, int32_t value) {
  std::vector<int32_t> values = ids.to_int_vector();
  values[0] = value;
  return Tensor::from_ints(values, ids.shape()).to(ids.device());
}

// `source` as it is, but for its integer inputs, whose bound it does not give.
class UnboundedInputs final : public BatchSource {
 public:
  explicit UnboundedInputs(const BatchSource& source) : source_(source) {}
  Batch train_batch(int64_t number) const override { return source_.train_batch(number); }
  int64_t batches_per_epoch() const override { return source_.batches_per_epoch(); }
  int64_t eval_batch_count() const override { return source_.eval_batch_count(); }
  Batch eval_batch(int64_t number) const override { return source_.eval_batch(number); }
  bool is_classification() const override { return source_.is_classification(); }
  int64_t num_classes() const override { return source_.num_classes(); }
  std::optional<int64_t> input_index_bound() const override { return std::nullopt; }
  std::string describe() const override { return source_.describe(); }

 private:
  const BatchSource& source_;
};

TEST_CASE("cuda: a recorded step hands back the steps it cannot replay", "[cuda][train]") {
  MIXPREC_REQUIRE_CUDA();
  const std::vector<std::string> gpt = small_gpt_run_or_warn({"precision=fp16"});
  if (gpt.empty()) return;
  Rig rig(gpt);
  const int64_t vocab = rig.s.data->num_classes();
  REQUIRE(rig.s.data->input_index_bound() == std::optional<int64_t>(vocab));
  const StepHooks hooks;

  // No moments yet: the first step is the caller's.
  CHECK_FALSE(rig.recorded.take(1, rig.batches(0), hooks).has_value());
  take_step(rig.s, *rig.optimizer, rig.deferred, *rig.schedule, rig.batches(0), hooks);
  rig.deferred.resolve();
  rig.recorded.end_window();

  // Recorded, then replayed.
  CHECK(rig.recorded.take(2, rig.batches(1), hooks).has_value());
  CHECK(rig.recorded.take(3, rig.batches(2), hooks).has_value());
  CHECK(rig.recorded.recordings() == 1);
  CHECK(rig.recorded.replays() == 1);

  SECTION("a step whose hooks say eager_only") {
    StepHooks eager = hooks;
    eager.eager_only = true;
    CHECK_FALSE(rig.recorded.take(4, rig.batches(3), eager).has_value());
  }
  SECTION("a step with an input id at the data's bound") {
    std::vector<Batch> bad = rig.batches(3);
    bad[0].inputs = with_first_id(bad[0].inputs, static_cast<int32_t>(vocab));
    CHECK_FALSE(rig.recorded.take(4, bad, hooks).has_value());
  }
  SECTION("a step with a negative target") {
    std::vector<Batch> bad = rig.batches(3);
    bad[0].targets = with_first_id(bad[0].targets, -1);
    CHECK_FALSE(rig.recorded.take(4, bad, hooks).has_value());
  }
  SECTION("a step whose input ids were written on the device (bounds unknown)") {
    std::vector<Batch> bad = rig.batches(3);
    Tensor ids = Tensor::empty(bad[0].inputs.shape(), DType::I32, rig.s.device);
    backend_for(rig.s.device).arange(ids, 0.0, 0.0);
    REQUIRE_FALSE(ids.index_bounds().has_value());
    bad[0].inputs = ids;
    CHECK_FALSE(rig.recorded.take(4, bad, hooks).has_value());
  }
  SECTION("a step whose integer inputs the data gives no bound for") {
    std::unique_ptr<BatchSource> bounded = std::move(rig.s.data);
    rig.s.data = std::make_unique<UnboundedInputs>(*bounded);
    CHECK_FALSE(rig.recorded.take(4, rig.batches(3), hooks).has_value());
    rig.s.data = std::move(bounded);
  }
  // Nothing was replayed for the step handed back, and its window ended: the next step
  // records anew.
  CHECK(rig.recorded.replays() == 1);
  CHECK(rig.recorded.take(5, rig.batches(4), hooks).has_value());
  CHECK(rig.recorded.recordings() == 2);
  CHECK(rig.recorded.replays() == 1);
}

}  // namespace
}  // namespace mixprec
