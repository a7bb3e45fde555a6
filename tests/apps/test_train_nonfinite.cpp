// Non-finite values in a run: a non-finite loss (debug.inject_nonfinite tensor `loss`) skips
// its step and is named; an input batch with Inf/NaN (tensor `input`) skips its step without a
// forward pass and names the batch; train.max_consecutive_skips stops a run that keeps
// skipping with a diagnostic, a checkpoint of the last good weights and exit code 3.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "amp/grad_scaler.h"
#include "amp/static_loss_scale.h"
#include "apps/checkpoint/safetensors.h"
#include "apps/config/train_config.h"
#include "apps/train/nonfinite_guard.h"
#include "apps/train/trainer.h"
#include "apps/train/training_stopped.h"
#include "train_test_support.h"

using namespace train_test;

namespace {

// repo_data.h's small CNN on the MNIST test set (in every checkout), FP16 with a dynamic
// scale of 1024 (far from FP16's overflow on this model), two microbatches a step, a
// checkpoint after every step.
std::string small_cnn_config() {
  return mixprec_test::small_mnist_cnn_yaml() +
         "precision: fp16\n"
         "loss_scale: {policy: dynamic, init_scale: 1024}\n"
         "optimizer: {type: sgd, lr: 0.05}\n"
         "train: {steps: 3, batch_size: 16, accumulation_steps: 2, log_every: 1}\n"
         "checkpoint: {every: 1, keep: 0}\n"
         "device: cpu\n";
}

// The model's parameter names: the checkpoint's tensors without the batch-norm buffers.
std::set<std::string> parameter_names(const std::string& model_file) {
  std::set<std::string> names;
  for (const auto& [name, tensor] : mixprec::read_safetensors(model_file).tensors) {
    if (!is_batch_norm_buffer(name)) names.insert(name);
  }
  return names;
}

}  // namespace

TEST_CASE("nonfinite: an Inf loss skips exactly its step, names the loss and keeps the weights",
          "[apps][train][nonfinite]") {
  if (!mnist_present()) {
    WARN("MNIST test set not found at " << mnist_dir() << "; skipped");
    return;
  }
  ScratchDir dir("nonfinite-loss");
  const std::string config = dir / "config.yaml";
  write_text(config, small_cnn_config());
  const std::string two = dir / "two", three = dir / "three";
  require_ok(run_cli(train_args(config, two, {"--set", "train.steps=2"})));
  require_ok(run_cli(train_args(config, three,
                                {"--set", "debug.inject_nonfinite={step: 3, tensor: loss}"})));

  // Step 3 moved nothing but the batch-norm statistics (its forward pass ran, as in torch).
  check_same_tensors(checkpoint_file(two, 2, "model.safetensors"),
                     checkpoint_file(three, 3, "model.safetensors"), true);
  const auto steps = step_records(three);
  REQUIRE(steps.size() == 3);
  for (int64_t step : {1, 2}) {
    CHECK_FALSE(steps.at(step)["skipped"].get<bool>());
    CHECK_FALSE(steps.at(step)["nonfinite_loss"].get<bool>());
  }
  const nlohmann::json& r = steps.at(3);
  CHECK(r["skipped"].get<bool>());
  CHECK(r["nonfinite_loss"].get<bool>());
  CHECK(r["loss"] == "inf");
  const std::string reason = r["reason"].get<std::string>();
  CHECK(reason.rfind("non-finite loss (inf); non-finite gradients", 0) == 0);
  // The loss comes first, then every parameter: d(Inf * loss) = Inf * d(loss) reaches all.
  const auto tensors = r["nonfinite_tensors"].get<std::vector<std::string>>();
  REQUIRE_FALSE(tensors.empty());
  CHECK(tensors.front() == "loss");
  CHECK(std::set<std::string>(tensors.begin() + 1, tensors.end()) ==
        parameter_names(checkpoint_file(three, 3, "model.safetensors")));
  // An overflow like any other: the dynamic scale backs off by its factor 0.5.
  CHECK(r["scale"] == 1024.0);
  CHECK(r["next_scale"] == 512.0);
  CHECK(read_json(three + "/summary.json")["skipped_steps"] == 1);
}

TEST_CASE("nonfinite: a NaN loss in bf16 is named as nan", "[apps][train][nonfinite]") {
  if (!mnist_present()) {
    WARN("MNIST test set not found; skipped");
    return;
  }
  ScratchDir dir("nonfinite-nan-loss");
  const std::string config = dir / "config.yaml";
  write_text(config, small_cnn_config());
  const std::string run = dir / "run";
  // bf16 uses no loss scaling: the scaler only checks, and still skips.
  require_ok(run_cli(train_args(config, run,
                                {"--set", "precision=bf16", "--set", "loss_scale.policy=none",
                                 "--set", "train.steps=1", "--set",
                                 "debug.inject_nonfinite={step: 1, tensor: loss, value: nan}"})));
  const nlohmann::json r = step_records(run).at(1);
  CHECK(r["skipped"].get<bool>());
  CHECK(r["loss"] == "nan");
  CHECK(r["reason"].get<std::string>().rfind("non-finite loss (nan); ", 0) == 0);
  CHECK(r["nonfinite_tensors"][0] == "loss");
  CHECK(r["scale"] == 1.0);
}

TEST_CASE("nonfinite: an input batch with NaN is skipped without a forward pass and named",
          "[apps][train][nonfinite]") {
  if (!mnist_present()) {
    WARN("MNIST test set not found; skipped");
    return;
  }
  ScratchDir dir("nonfinite-input");
  const std::string config = dir / "config.yaml";
  write_text(config, small_cnn_config());
  const std::string run = dir / "run";
  require_ok(run_cli(train_args(
      config, run, {"--set", "debug.inject_nonfinite={step: 2, tensor: input, value: nan}"})));

  const auto steps = step_records(run);
  REQUIRE(steps.size() == 3);
  const nlohmann::json& r = steps.at(2);
  // Two microbatches a step: step 2 is made of batches 2 and 3; the value went into batch 2.
  CHECK(r["skipped"].get<bool>());
  CHECK(r["reason"] == "input batch 2 has a non-finite value (nan) at element 0");
  CHECK(r["input_batch"] == 2);
  CHECK(r["nonfinite_tensors"] == nlohmann::json::array({"input"}));
  CHECK(r["loss"].is_null());
  CHECK_FALSE(r["found_inf"].get<bool>());
  // Not an overflow: the scale stays.
  CHECK(r["scale"] == 1024.0);
  CHECK(r["next_scale"] == 1024.0);
  CHECK_FALSE(steps.at(1)["skipped"].get<bool>());
  CHECK_FALSE(steps.at(3)["skipped"].get<bool>());
  CHECK(steps.at(3)["scale"] == 1024.0);

  // No forward pass: even the batch-norm statistics are those after step 1.
  check_same_tensors(checkpoint_file(run, 1, "model.safetensors"),
                     checkpoint_file(run, 2, "model.safetensors"), false);
  // The data position advanced past the bad step's two batches.
  CHECK(read_json(checkpoint_file(run, 1, "state.json"))["next_batch"] == 2);
  CHECK(read_json(checkpoint_file(run, 2, "state.json"))["next_batch"] == 4);
  CHECK(read_json(checkpoint_file(run, 3, "state.json"))["next_batch"] == 6);
  // Step 3 trained on.
  const auto w2 = mixprec::read_safetensors(checkpoint_file(run, 2, "model.safetensors"));
  const auto w3 = mixprec::read_safetensors(checkpoint_file(run, 3, "model.safetensors"));
  CHECK(w2.tensors.at("5.weight").to_float_vector() != w3.tensors.at("5.weight").to_float_vector());
  const nlohmann::json summary = read_json(run + "/summary.json");
  CHECK(summary["skipped_steps"] == 1);
  CHECK(summary["steps"] == 3);
}

TEST_CASE("nonfinite: injecting into the input of token data is bad input",
          "[apps][train][nonfinite]") {
  ScratchDir dir("nonfinite-tokens");
  std::string text;
  for (int i = 0; i < 200; ++i) text += "to be or not to be ";
  write_text(dir / "text.txt", text);
  const std::string config = dir / "gpt.yaml";
  write_text(config,
             "model: {type: gpt, block_size: 8, n_layer: 1, n_head: 1, n_embd: 8}\n"
             "data: {kind: text, path: " + (dir / "text.txt") + "}\n"
             "train: {steps: 2, batch_size: 2}\ndevice: cpu\n"
             "debug: {inject_nonfinite: {step: 1, tensor: input}}\n");
  const CliResult r = run_cli(train_args(config, dir / "run"));
  INFO("stderr: " << r.err);
  CHECK(r.code == 2);
  CHECK(r.err.find("'input' needs floating inputs") != std::string::npos);
  CHECK(r.err.find("I32") != std::string::npos);
  CHECK_FALSE(fs::exists(dir / "run"));
}

TEST_CASE("nonfinite: a run whose every step overflows stops after max_consecutive_skips",
          "[apps][train][nonfinite]") {
  if (!mnist_present()) {
    WARN("MNIST test set not found; skipped");
    return;
  }
  ScratchDir dir("nonfinite-stop");
  const std::string config = dir / "config.yaml";
  // S = 2^30 against FP16's largest value 65504: the scaled gradient of the logits, about
  // S * (p - y) / 16, overflows as soon as |p - y| > 1e-3, at every step. The dynamic scale
  // may back off only to 2^28, which overflows just the same.
  write_text(config, small_cnn_config());
  const std::vector<std::string> overflow{
      "--set", "loss_scale={policy: dynamic, init_scale: 1073741824.0, "
               "max_scale: 1073741824.0, min_scale: 268435456.0}",
      "--set", "train.steps=20", "--set", "checkpoint.every=0",
      "--set", "checkpoint.save_initial=true", "--set", "train.max_consecutive_skips=5"};
  const std::string run = dir / "run";

  mixprec::TrainOptions options;
  options.config_path = config;
  options.out_dir = run;
  for (size_t i = 1; i < overflow.size(); i += 2) options.overrides.push_back(overflow[i]);
  std::ostringstream log;
  nlohmann::json diagnostic;
  std::string checkpoint;
  try {
    mixprec::run_training(options, log);
    FAIL("the run did not stop");
  } catch (const mixprec::TrainingStopped& e) {
    diagnostic = e.diagnostic();
    checkpoint = e.checkpoint();
    INFO(e.what());
    const std::string message = e.what();
    CHECK(message.find("training stopped at step 5") != std::string::npos);
    CHECK(message.find("5 steps in a row") != std::string::npos);
    CHECK(message.find("5.weight (5)") != std::string::npos);
    CHECK(message.find("loss scale now 268435456 (dynamic, min_scale 268435456)") !=
          std::string::npos);
    CHECK(message.find("the weights are those after step 0") != std::string::npos);
  }
  // The scale halved at each of the 5 overflows down to its floor: max(2^30 / 2^5, 2^28).
  const double expected_scale = std::max(std::ldexp(1.0, 30 - 5), std::ldexp(1.0, 28));
  CHECK(diagnostic["event"] == "stopped");
  CHECK(diagnostic["step"] == 5);
  CHECK(diagnostic["skipped_in_a_row"] == 5);
  CHECK(diagnostic["max_consecutive_skips"] == 5);
  CHECK(diagnostic["first_skipped_step"] == 1);
  CHECK(diagnostic["last_applied_step"] == 0);
  CHECK(diagnostic["scale"] == expected_scale);
  CHECK(diagnostic["min_scale"] == std::ldexp(1.0, 28));
  CHECK(diagnostic["loss_scale_policy"] == "dynamic");
  CHECK(checkpoint == run + "/checkpoints/step_5");

  // metrics.jsonl: five skipped steps, then the same diagnostic. Its counts are the number of
  // step records that named each tensor.
  const auto records = read_jsonl(run + "/metrics.jsonl");
  std::map<std::string, int64_t> named;
  int64_t skipped = 0;
  for (const auto& r : records) {
    if (r["event"] != "step") continue;
    CHECK(r["skipped"].get<bool>());
    ++skipped;
    for (const auto& name : r["nonfinite_tensors"]) ++named[name.get<std::string>()];
  }
  CHECK(skipped == 5);
  REQUIRE(records.back()["event"] == "stopped");
  CHECK(records.back() == diagnostic);
  REQUIRE_FALSE(named.empty());
  CHECK(diagnostic["nonfinite_counts"].get<std::map<std::string, int64_t>>() == named);
  CHECK(named.count("loss") == 0);  // the loss itself was finite: backward overflowed
  CHECK(named.at("5.weight") == 5);

  // The checkpoint holds the last good weights (the initial ones) and loads for eval.
  check_same_tensors(checkpoint_file(run, 0, "model.safetensors"),
                     checkpoint_file(run, 5, "model.safetensors"), true);
  const nlohmann::json state = read_json(checkpoint_file(run, 5, "state.json"));
  CHECK(state["step"] == 5);
  CHECK(state["skipped_steps"] == 5);
  CHECK(state["next_batch"] == 10);
  const CliResult eval = run_cli({"eval", config, "--checkpoint", run});
  INFO(eval.err);
  CHECK(eval.code == 0);
  CHECK_FALSE(fs::exists(run + "/summary.json"));

  // Through the command line: exit code 3 and one line.
  const CliResult cli = run_cli(train_args(config, dir / "cli", overflow));
  INFO("stderr: " << cli.err);
  CHECK(cli.code == mixprec::kExitTrainingStopped);
  CHECK(cli.code == 3);
  CHECK(cli.err.rfind("error: training stopped at step 5", 0) == 0);
  CHECK(std::count(cli.err.begin(), cli.err.end(), '\n') == 1);

  // A resumed run continues the count: 3 skips, then 2 more stop it at step 5.
  const std::string resumed = dir / "resumed";
  std::vector<std::string> short_run = overflow;
  short_run[3] = "train.steps=3";
  require_ok(run_cli(train_args(config, resumed, short_run)));
  const CliResult continued = run_cli(as_resume(train_args(config, resumed, overflow)));
  INFO("stderr: " << continued.err);
  CHECK(continued.code == 3);
  CHECK(continued.err.find("training stopped at step 5: 5 steps in a row") != std::string::npos);

  // 0 never stops: the same 8 overflows run to the end.
  std::vector<std::string> never = overflow;
  never[3] = "train.steps=8";
  never.back() = "train.max_consecutive_skips=0";
  const std::string unlimited = dir / "unlimited";
  require_ok(run_cli(train_args(config, unlimited, never)));
  CHECK(read_json(unlimited + "/summary.json")["skipped_steps"] == 8);
}

namespace {

// The guard's counting on its own: a data set that is never read (no injection).
class NoData final : public mixprec::BatchSource {
 public:
  mixprec::Batch train_batch(int64_t) const override { return {}; }
  int64_t batches_per_epoch() const override { return 1; }
  int64_t eval_batch_count() const override { return 0; }
  mixprec::Batch eval_batch(int64_t) const override { return {}; }
  bool is_classification() const override { return true; }
  int64_t num_classes() const override { return 10; }
  std::optional<int64_t> input_index_bound() const override { return std::nullopt; }
  std::string describe() const override { return "no data"; }
};

// A data set with floating inputs, for a guard that injects into `input` (it checks the
// dtype of the first evaluation batch); its batches are never used otherwise.
class FloatData final : public mixprec::BatchSource {
 public:
  mixprec::Batch train_batch(int64_t number) const override { return eval_batch(number); }
  int64_t batches_per_epoch() const override { return 1; }
  int64_t eval_batch_count() const override { return 1; }
  mixprec::Batch eval_batch(int64_t number) const override {
    mixprec::Batch batch;
    batch.inputs = mixprec::Tensor::from_vector({1.f, 2.f}, {1, 2});
    batch.targets = mixprec::Tensor::from_ints({0}, {1});
    batch.number = number;
    return batch;
  }
  bool is_classification() const override { return true; }
  int64_t num_classes() const override { return 2; }
  std::optional<int64_t> input_index_bound() const override { return std::nullopt; }
  std::string describe() const override { return "float data"; }
};

// `count` batches numbered first, first + 1, ... of finite F32 inputs [2, 4] (values 0..7).
std::vector<mixprec::Batch> finite_batches(int64_t first, int count) {
  std::vector<mixprec::Batch> batches(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    batches[i].number = first + i;
    batches[i].inputs =
        mixprec::Tensor::from_vector({0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f}, {2, 4});
  }
  return batches;
}

mixprec::StepResult skipped_in(std::vector<std::string> tensors) {
  mixprec::StepResult r;
  r.outcome = mixprec::StepResult::Outcome::Skipped;
  r.reason = "non-finite gradients";
  r.nonfinite_tensors = std::move(tensors);
  return r;
}

}  // namespace

TEST_CASE("nonfinite guard: counts skips in a row, resets on a good step, names the loss",
          "[apps][train][nonfinite]") {
  mixprec::TrainConfig config;
  config.train.max_consecutive_skips = 3;
  const NoData data;
  mixprec::NonfiniteGuard guard(config, {}, data, 100);
  std::vector<mixprec::Batch> none;
  auto finish = [&](int64_t step, mixprec::StepResult result, std::optional<double> loss) {
    REQUIRE_FALSE(guard.begin_step(step, none));
    mixprec::StepTelemetry telemetry;
    telemetry.skipped = result.skipped();
    telemetry.reason = result.reason;
    telemetry.nonfinite_tensors = result.nonfinite_tensors;
    const bool stop = guard.finish_step(step, result, telemetry, loss);
    return std::make_pair(stop, telemetry);
  };
  const double inf = std::numeric_limits<double>::infinity();
  CHECK_FALSE(finish(1, skipped_in({"a"}), 2.0).first);
  CHECK_FALSE(finish(2, skipped_in({"a", "b"}), inf).first);
  CHECK(guard.skipped_in_a_row() == 2);
  CHECK_FALSE(finish(3, mixprec::StepResult{}, std::nullopt).first);  // stepped: the count restarts
  CHECK(guard.skipped_in_a_row() == 0);
  CHECK_FALSE(finish(4, skipped_in({"b"}), std::nullopt).first);
  const auto [stop5, t5] = finish(5, skipped_in({"a", "b"}), std::nan(""));
  CHECK_FALSE(stop5);
  CHECK(t5.skipped_in_a_row == 2);
  CHECK(t5.reason.rfind("non-finite loss (nan); ", 0) == 0);
  CHECK(t5.nonfinite_tensors == std::vector<std::string>{"loss", "a", "b"});
  const auto [stop6, t6] = finish(6, skipped_in({"b"}), 1.5);  // a finite loss is not named
  CHECK(stop6);
  CHECK(t6.nonfinite_tensors == std::vector<std::string>{"b"});

  mixprec::GradScaler scaler(std::make_unique<mixprec::StaticLossScale>(8.0));
  const nlohmann::json record = guard.stop_record(6, scaler, "ckpt/step_6");
  // Steps 4-6 only: what steps 1-2 named is not counted.
  CHECK(record["nonfinite_counts"] == nlohmann::json{{"b", 3}, {"a", 1}, {"loss", 1}});
  CHECK(record["first_skipped_step"] == 4);
  CHECK(record["last_applied_step"] == 3);
  CHECK(record["scale"] == 8.0);
  CHECK(record["min_scale"].is_null());
  CHECK(record["loss_scale_policy"] == "static");
  CHECK(record["message"].get<std::string>().find("b (3), loss (1), a (1)") != std::string::npos);
}

TEST_CASE("nonfinite guard: finds the first non-finite input element of the first bad batch",
          "[apps][train][nonfinite]") {
  mixprec::TrainConfig config;
  const NoData data;
  mixprec::NonfiniteGuard guard(config, {}, data, 10);
  std::vector<mixprec::Batch> batches(3);
  for (int i = 0; i < 3; ++i) {
    batches[i].number = 40 + i;
    batches[i].inputs = mixprec::Tensor::from_vector({0.f, 1.f, 2.f, 3.f}, {2, 2});
  }
  CHECK_FALSE(guard.begin_step(1, batches));
  batches[2].inputs.set(1, -std::numeric_limits<double>::infinity());
  batches[1].inputs.set(3, std::numeric_limits<double>::infinity());
  const auto bad = guard.begin_step(2, batches);
  REQUIRE(bad);
  CHECK(bad->skipped());
  CHECK(bad->reason == "input batch 41 has a non-finite value (inf) at element 3");
  batches[1].inputs.set(3, 0.0);
  CHECK(guard.begin_step(3, batches)->reason ==
        "input batch 42 has a non-finite value (-inf) at element 1");
  // Other floating dtypes keep their Inf/NaN through the check; token ids are not checked.
  batches[2].inputs = mixprec::Tensor::from_vector({0.f, std::nanf("")}, {2}, mixprec::DType::BF16);
  CHECK(guard.begin_step(4, batches)->reason ==
        "input batch 42 has a non-finite value (nan) at element 1");
  batches[2].inputs = mixprec::Tensor::from_ints({1, 2}, {2});
  CHECK_FALSE(guard.begin_step(5, batches));

  // A batch the size of a few images' worth: the first bad element wherever it lies (the
  // scan works in blocks), the earliest of several, the last element, a subnormal and the
  // largest finite value passing.
  std::vector<float> big(50003, 0.5f);
  big[7] = std::numeric_limits<float>::denorm_min();
  big[8] = std::numeric_limits<float>::max();
  big[9] = -std::numeric_limits<float>::max();
  std::vector<mixprec::Batch> one(1);
  one[0].number = 7;
  one[0].inputs = mixprec::Tensor::from_vector(big, {50003});
  CHECK_FALSE(guard.begin_step(6, one));
  const auto reason = [&](int64_t step) {
    const auto result = guard.begin_step(step, one);
    return result ? result->reason : std::string("finite");
  };
  big[50002] = std::nanf("");
  one[0].inputs = mixprec::Tensor::from_vector(big, {50003});
  CHECK(reason(7) == "input batch 7 has a non-finite value (nan) at element 50002");
  big[40000] = -std::numeric_limits<float>::infinity();
  big[45000] = std::numeric_limits<float>::infinity();
  one[0].inputs = mixprec::Tensor::from_vector(big, {50003});
  CHECK(reason(8) == "input batch 7 has a non-finite value (-inf) at element 40000");
  big[16383] = std::numeric_limits<float>::infinity();  // the last element of a block
  one[0].inputs = mixprec::Tensor::from_vector(big, {50003});
  CHECK(reason(9) == "input batch 7 has a non-finite value (inf) at element 16383");
}

TEST_CASE("nonfinite guard: takes a batch's input_scan instead of reading its inputs",
          "[apps][train][nonfinite]") {
  mixprec::TrainConfig config;
  const NoData data;
  mixprec::NonfiniteGuard guard(config, {}, data, 10);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<mixprec::Batch> batches = finite_batches(60, 2);
  // Finite data, but the scan made when the batch was built says element 5 is NaN.
  batches[0].input_scan = mixprec::InputScan{};
  batches[1].input_scan = mixprec::InputScan{5, nan};
  const auto bad = guard.begin_step(1, batches);
  REQUIRE(bad);
  CHECK(bad->reason == "input batch 61 has a non-finite value (nan) at element 5");
  CHECK(guard.input_is_bad(2, batches));
  const auto asked_first = guard.begin_step(2, batches);
  REQUIRE(asked_first);
  CHECK(asked_first->reason == "input batch 61 has a non-finite value (nan) at element 5");
  // The other way round: Inf in the data, a scan that found nothing; the scan is believed.
  batches[1].inputs.set(2, inf);
  batches[1].input_scan = mixprec::InputScan{};
  CHECK_FALSE(guard.input_is_bad(3, batches));
  CHECK_FALSE(guard.begin_step(3, batches));
  // A batch without a scan is scanned, beside one with a scan.
  batches[1].input_scan.reset();
  CHECK(guard.input_is_bad(4, batches));
  const auto scanned = guard.begin_step(4, batches);
  REQUIRE(scanned);
  CHECK(scanned->reason == "input batch 61 has a non-finite value (inf) at element 2");
  // The first bad batch wins, whether its scan was given or made here.
  batches[0].input_scan = mixprec::InputScan{7, -inf};
  CHECK(guard.begin_step(6, batches)->reason ==
        "input batch 60 has a non-finite value (-inf) at element 7");
}

TEST_CASE("nonfinite guard: an input injection names element 0 over a finite input_scan",
          "[apps][train][nonfinite]") {
  const FloatData data;
  for (const std::string value : {"nan", "inf"}) {
    INFO("value " << value);
    mixprec::TrainConfig config;
    config.debug.inject_step = 2;
    config.debug.inject_tensor = "input";
    config.debug.inject_value = value;
    mixprec::NonfiniteGuard guard(config, {}, data, 10);
    std::vector<mixprec::Batch> batches = finite_batches(70, 2);
    for (mixprec::Batch& batch : batches) batch.input_scan = mixprec::InputScan{};
    const mixprec::Tensor original = batches[0].inputs;
    CHECK_FALSE(guard.input_is_bad(1, batches));
    CHECK_FALSE(guard.begin_step(1, batches));
    CHECK(guard.input_is_bad(2, batches));
    const auto bad = guard.begin_step(2, batches);
    REQUIRE(bad);
    CHECK(bad->reason == "input batch 70 has a non-finite value (" + value + ") at element 0");
    CHECK(bad->nonfinite_tensors == std::vector<std::string>{"input"});
    // The first batch's scan now says what was put there, and the data holds it.
    REQUIRE(batches[0].input_scan.has_value());
    CHECK(batches[0].input_scan->element == 0);
    const double injected = batches[0].inputs.get(0);
    if (value == "nan") {
      CHECK(std::isnan(batches[0].input_scan->value));
      CHECK(std::isnan(injected));
    } else {
      CHECK(batches[0].input_scan->value == std::numeric_limits<double>::infinity());
      CHECK(injected == std::numeric_limits<double>::infinity());
    }
    // Into a copy: the batch's former tensor and the rest of the data are unchanged.
    CHECK(original.get(0) == 0.0);
    for (int64_t i = 1; i < 8; ++i) CHECK(batches[0].inputs.get(i) == static_cast<double>(i));
    // Later steps are not injected.
    std::vector<mixprec::Batch> next = finite_batches(72, 2);
    CHECK_FALSE(guard.begin_step(3, next));
  }
}
