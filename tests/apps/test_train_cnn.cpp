// End to end: `mixprec train` on the real cnn_fashion config (shortened with --set) learns in
// FP32, FP16 and BF16, writes the documented run directory, and `mixprec eval` reads its
// checkpoint back.
#include <catch2/catch.hpp>

#include <cmath>

#include "apps/checkpoint/safetensors.h"
#include "train_test_support.h"

using namespace train_test;

namespace {

// The cnn_fashion config cut to `steps` steps of batch 32 and 1000 test images.
std::vector<std::string> short_cnn_run(const std::string& out, const std::string& precision,
                                       int steps) {
  return {"train", config_path("cnn_fashion.yaml"), "--out", out,
          "--set", "precision=" + precision,
          "--set", "train.steps=" + std::to_string(steps),
          "--set", "train.batch_size=32",
          "--set", "train.log_every=1",
          "--set", "train.eval_every=0",
          "--set", "schedule.warmup_steps=20",
          "--set", "data.limit_test=1000",
          "--set", "checkpoint.every=0",
          "--set", "device=cpu"};
}

double mean_loss(const std::vector<nlohmann::json>& records, size_t from, size_t to) {
  double sum = 0.0;
  size_t count = 0;
  for (const auto& r : records) {
    if (r["event"] != "step") continue;
    const int64_t step = r["step"].get<int64_t>();
    if (step >= static_cast<int64_t>(from) && step < static_cast<int64_t>(to)) {
      sum += r["loss"].get<double>();
      ++count;
    }
  }
  REQUIRE(count > 0);
  return sum / static_cast<double>(count);
}

}  // namespace

TEST_CASE("cnn_fashion learns for 200 steps in fp32, fp16 and bf16", "[apps][train][slow]") {
  if (!fashion_mnist_installed()) {
    WARN("Fashion-MNIST is not installed (scripts/setup.sh installs dataset-fashion-mnist); skipped");
    return;
  }
  for (const std::string precision : {"fp32", "fp16", "bf16"}) {
    INFO("precision " << precision);
    ScratchDir dir("cnn-" + precision);
    const std::string run = dir / "run";
    const CliResult r = run_cli(short_cnn_run(run, precision, 200));
    INFO(r.err);
    REQUIRE(r.code == 0);

    const auto metrics = read_jsonl(run + "/metrics.jsonl");
    // Stated margin: the mean loss of the last 20 steps is below 40% of that of the first 5
    // (about 2.3 at the start, chance level for 10 classes).
    const double first = mean_loss(metrics, 1, 6);
    const double last = mean_loss(metrics, 181, 201);
    CHECK(first > 1.8);
    CHECK(last < 0.4 * first);

    const nlohmann::json summary = read_json(run + "/summary.json");
    CHECK(summary["steps"] == 200);
    CHECK(summary["precision"] == precision);
    CHECK(summary["device"] == "cpu");
    CHECK(summary["val_accuracy"].get<double>() > 0.70);
    CHECK(summary["samples_per_s"].get<double>() > 0.0);
    CHECK(summary["median_step_ms"].get<double>() > 0.0);
    for (const char* key : {"skipped_steps", "final_scale", "train_loss", "val_loss"}) {
      CHECK(summary.contains(key));
    }
    int64_t skipped = 0;
    for (const auto& r : metrics) skipped += r["event"] == "step" && r["skipped"].get<bool>();
    CHECK(summary["skipped_steps"] == skipped);
    if (precision == "fp16") {
      // Dynamic scaling from 2^16 without growth (growth_interval 2000 > 200 steps): every
      // skipped step halved the scale, and nothing else moved it.
      CHECK(summary["final_scale"].get<double>() == std::ldexp(65536.0, -static_cast<int>(skipped)));
      CHECK(skipped < 10);
    } else {
      // fp32 and bf16 need no loss scaling: the config's `auto` policy gives none.
      CHECK(summary["final_scale"] == 1.0);
      CHECK(skipped == 0);
    }
    // The resolved config, and a final checkpoint whose tensors carry torch's names.
    CHECK(fs::exists(run + "/config.yaml"));
    const auto file = mixprec::read_safetensors(run + "/checkpoints/step_200/model.safetensors");
    CHECK(file.tensors.at("0.weight").shape() == mixprec::Shape{32, 1, 3, 3});
    CHECK(file.tensors.at("9.weight").shape() == mixprec::Shape{128, 3136});
    CHECK(file.tensors.at("1.running_var").dtype() == mixprec::DType::F32);
    CHECK(file.tensors.at("0.weight").dtype() == mixprec::DType::F32);  // the FP32 master

    // eval on the checkpoint (same evaluation batches) gives what the run reported.
    const CliResult e = run_cli({"eval", config_path("cnn_fashion.yaml"), "--checkpoint", run,
                                 "--set", "precision=" + precision, "--set", "data.limit_test=1000",
                                 "--set", "train.batch_size=32", "--set", "device=cpu"});
    INFO(e.err);
    REQUIRE(e.code == 0);
    const nlohmann::json evaluated = nlohmann::json::parse(e.out);
    CHECK(evaluated["accuracy"].get<double>() == summary["val_accuracy"].get<double>());
    CHECK(evaluated["loss"].get<double>() == summary["val_loss"].get<double>());
    CHECK(evaluated["step"] == 200);
  }
}

TEST_CASE("save_initial writes step_0 with the untrained weights", "[apps][train]") {
  if (!fashion_mnist_installed()) {
    WARN("Fashion-MNIST is not installed; skipped");
    return;
  }
  ScratchDir dir("initial");
  const std::string run = dir / "run";
  auto args = short_cnn_run(run, "fp32", 2);
  args.insert(args.end(), {"--set", "checkpoint.save_initial=true", "--set", "data.limit_test=64"});
  const CliResult r = run_cli(args);
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto initial = mixprec::read_safetensors(run + "/checkpoints/step_0/model.safetensors");
  const auto trained = mixprec::read_safetensors(run + "/checkpoints/step_2/model.safetensors");
  // PyTorch's Conv2d default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in = 9.
  const auto w0 = initial.tensors.at("0.weight").to_float_vector();
  for (float v : w0) CHECK(std::abs(v) <= 1.0f / 3.0f);
  CHECK(w0 != trained.tensors.at("0.weight").to_float_vector());
  CHECK(initial.tensors.at("1.num_batches_tracked").item() == 0);
  CHECK(trained.tensors.at("1.num_batches_tracked").item() == 2);
}
