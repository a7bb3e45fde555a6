// train.cuda_graph on cuda:0: the deferred step recorded once per window and replayed for the
// window's other steps (apps/train/recorded_step.h) trains exactly as the same run without
// it: every logged step, the summary's outcome and the final checkpoint (weights, optimizer
// state, scaler, BatchNorm's host-side step counter) are equal, bit for bit. The runs go
// through run_training, as `mixprec train` does, with the real data prefetcher uploading on
// its own thread while steps are recorded.
#include <catch2/catch.hpp>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/train/trainer.h"
#include "core/error.h"
#include "cuda/register.h"
#include "tests/cuda/backend_agreement.h"
#include "tests/cuda/train_run_support.h"

namespace mixprec {
namespace {

using namespace cuda_train_test;

// What must match between two runs: the outcome fields of each logged step and of the
// summary (not their timings), and the last checkpoint.
struct GraphRun {
  std::vector<nlohmann::json> steps;
  nlohmann::json summary;
  std::string weights;    // the last checkpoint's model.safetensors
  nlohmann::json state;   // its state.json without the config text and the wall time
};

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

GraphRun graph_training_run(const std::string& config, std::vector<std::string> overrides,
                            bool cuda_graph) {
  ScratchDir dir(std::string("cuda-graph-training-") + (cuda_graph ? "on" : "off"));
  overrides.push_back("device=cuda");
  overrides.push_back(std::string("train.cuda_graph=") + (cuda_graph ? "true" : "false"));
  const LoggedRun logged = train_into(dir / "run", config, std::move(overrides));
  GraphRun run;
  run.summary = logged.summary;
  for (const auto& entry : logged.steps) {
    const nlohmann::json& record = entry.second;
    nlohmann::json kept;
    for (const char* key : {"step", "loss", "train_loss", "lr", "epoch", "scale", "next_scale",
                            "skipped", "grad_norm", "scale_event"}) {
      if (record.contains(key)) kept[key] = record[key];
    }
    run.steps.push_back(kept);
  }
  const fs::path last = fs::path(dir / "run/checkpoints") /
                        ("step_" + std::to_string(run.summary["steps"].get<int64_t>()));
  run.weights = read_bytes(last / "model.safetensors");
  run.state = nlohmann::json::parse(read_bytes(last / "state.json"));
  run.state.erase("config");
  run.state.erase("train_seconds");
  return run;
}

// Trains `config` without and with train.cuda_graph and requires the same run; returns the
// recorded run's summary.
nlohmann::json expect_same_run(const std::string& config, const std::vector<std::string>& overrides) {
  const GraphRun eager = graph_training_run(config, overrides, false);
  const GraphRun graphed = graph_training_run(config, overrides, true);
  REQUIRE(eager.summary["device"] == "cuda:0");
  CHECK_FALSE(eager.summary.contains("cuda_graph"));
  REQUIRE(eager.steps.size() == graphed.steps.size());
  for (size_t i = 0; i < eager.steps.size(); ++i) {
    INFO("logged step " << eager.steps[i].value("step", -1));
    CHECK(graphed.steps[i].dump() == eager.steps[i].dump());
  }
  for (const char* key : {"steps", "skipped_steps", "final_scale", "train_loss", "val_loss"}) {
    INFO("summary." << key);
    CHECK(graphed.summary[key].dump() == eager.summary[key].dump());
  }
  REQUIRE_FALSE(eager.weights.empty());
  CHECK(graphed.weights == eager.weights);
  CHECK(graphed.state.dump() == eager.state.dump());
  REQUIRE(graphed.summary.contains("cuda_graph"));
  return graphed.summary;
}

// 16 steps in FP16, logged (and read) at steps 1, 4, 8, 12 and 16: windows of three or four
// steps, each recorded once and replayed for the rest.
const std::vector<std::string> kGraphSchedule = {"precision=fp16",    "train.steps=16",
                                                 "train.log_every=4", "train.eval_every=0",
                                                 "checkpoint.every=0"};

// The run's recordings and replays, against those its windows call for.
void expect_replayed(const nlohmann::json& summary, int64_t recordings, int64_t replays) {
  CHECK(summary["cuda_graph"]["recordings"].get<int64_t>() == recordings);
  CHECK(summary["cuda_graph"]["replays"].get<int64_t>() == replays);
}

TEST_CASE("cuda: train.cuda_graph replays the GPT's steps bit for bit", "[cuda][train]") {
  MIXPREC_REQUIRE_CUDA();
  const std::vector<std::string> gpt = small_gpt_run_or_warn(kGraphSchedule);
  if (gpt.empty()) return;
  // AdamW with warmup and cosine decay (each step's learning rate differs) and clipping.
  // Step 1 is eager (AdamW has no moments before it); windows 2-4, 5-8, 9-12 and 13-16 each
  // record their first step and replay the others.
  expect_replayed(expect_same_run(config_path("gpt_shakespeare.yaml"), gpt), 4, 11);
}

TEST_CASE("cuda: train.cuda_graph replays steps of two microbatches in BF16 and FP32 bit for bit",
          "[cuda][train]") {
  MIXPREC_REQUIRE_CUDA();
  const std::vector<std::string> gpt = small_gpt_run_or_warn(kGraphSchedule);
  if (gpt.empty()) return;
  // Without a loss scale (BF16 and FP32 have none), each step accumulating two microbatches,
  // each copied into its own fixed tensors.
  for (const char* precision : {"precision=bf16", "precision=fp32"}) {
    INFO(precision);
    expect_replayed(expect_same_run(config_path("gpt_shakespeare.yaml"),
                                    with(gpt, {precision, "train.accumulation_steps=2"})),
                    4, 11);
  }
}

TEST_CASE("cuda: train.cuda_graph replays a CNN with batch norm and a skipped step bit for bit",
          "[cuda][train]") {
  MIXPREC_REQUIRE_CUDA();
  // Batch norm (its running statistics on the device, its step counter on the host), SGD
  // with momentum, clipping; step 6 gets an Inf loss, is taken eagerly and skipped, and the
  // window goes on with a new recording.
  ScratchDir dir("cuda-graph-training-cnn");
  const std::string config =
      write_small_mnist_cnn(dir.path(), "debug: {inject_nonfinite: {step: 6, tensor: loss, value: inf}}\n");
  if (config.empty()) return;
  const nlohmann::json summary = expect_same_run(config, kGraphSchedule);
  CHECK(summary["skipped_steps"].get<int64_t>() == 1);
  // Eager: step 1 (no momentum yet) and step 6 (injected). Recorded: steps 2, 5, 7 (the
  // window goes on after the eager step 6 with a new recording), 9 and 13; the other nine
  // are replays.
  expect_replayed(summary, 5, 9);
}

TEST_CASE("cuda: train.cuda_graph replays a GPT with dropout, each step with its own masks",
          "[cuda][train]") {
  MIXPREC_REQUIRE_CUDA();
  const std::vector<std::string> gpt = small_gpt_run_or_warn(kGraphSchedule);
  if (gpt.empty()) return;
  // Dropout on the embeddings, the attention matrix and both residual branches: a replay
  // that drew the recorded step's masks again would train differently from the eager run.
  expect_replayed(
      expect_same_run(config_path("gpt_shakespeare.yaml"), with(gpt, {"model.dropout=0.1"})), 4, 11);
}

}  // namespace
}  // namespace mixprec
