// Resume is bit-identical to an uninterrupted run; an injected non-finite gradient skips
// exactly its step and leaves the weights as they were.
#include <catch2/catch.hpp>

#include <utility>

#include "train_test_support.h"

using namespace train_test;

namespace {

std::vector<std::string> cnn_args(const std::string& out, int steps,
                                  std::vector<std::string> extra = {}) {
  std::vector<std::string> args{"train", config_path("cnn_fashion.yaml"), "--out", out,
                                "--set", "train.steps=" + std::to_string(steps),
                                "--set", "train.batch_size=16",
                                "--set", "train.accumulation_steps=2",
                                "--set", "train.log_every=1",
                                "--set", "data.limit_train=512",
                                "--set", "data.limit_test=64",
                                "--set", "checkpoint.every=4",
                                "--set", "checkpoint.keep=0",
                                "--set", "schedule.warmup_steps=2",
                                "--set", "device=cpu"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// repo_data.h's small GPT with dropout on the shakespeare corpus, so that the dropout
// generator's state is part of what a resume must restore.
std::vector<std::string> gpt_args(const std::string& out, int steps,
                                  std::vector<std::string> extra = {}) {
  std::vector<std::string> args = train_args(
      config_path("gpt_shakespeare.yaml"), out,
      mixprec_test::as_set_args(mixprec_test::small_gpt_overrides(shakespeare_path())));
  const std::vector<std::string> own = mixprec_test::as_set_args(
      {"model.dropout=0.1", "precision=bf16", "train.steps=" + std::to_string(steps),
       "train.log_every=1", "train.eval_every=0", "checkpoint.every=3", "checkpoint.keep=0",
       "schedule.warmup_steps=1", "device=cpu"});
  args.insert(args.end(), own.begin(), own.end());
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

}  // namespace

// A copy of a finished run as a crash after checkpoint `step` would leave it: the later
// checkpoints and the summary gone (metrics.jsonl keeps its later lines, which the resumed
// run must replace).
void crash_copy(const std::string& run, const std::string& copy, int step) {
  fs::copy(run, copy, fs::copy_options::recursive);
  fs::remove(copy + "/summary.json");
  for (const auto& entry : fs::directory_iterator(copy + "/checkpoints")) {
    const std::string name = entry.path().filename().string();
    if (std::stoi(name.substr(5)) > step) fs::remove_all(entry.path());
  }
}

bool same_bytes(const std::string& a, const std::string& b) {
  const std::string x = read_text(a), y = read_text(b);
  return !x.empty() && x == y;
}

// Checks that the checkpoints of step `step` of the run straight through and of the resumed
// one hold the same model bytes; returns their state.json, the straight run's first.
std::pair<nlohmann::json, nlohmann::json> compare_final_checkpoints(const std::string& straight,
                                                                    const std::string& resumed,
                                                                    int step) {
  CHECK(same_bytes(checkpoint_file(straight, step, "model.safetensors"),
                   checkpoint_file(resumed, step, "model.safetensors")));
  return {read_json(checkpoint_file(straight, step, "state.json")),
          read_json(checkpoint_file(resumed, step, "state.json"))};
}

TEST_CASE("resume: fp16 with accumulation and a skipped step is bit-identical", "[apps][train]") {
  if (!fashion_mnist_installed()) {
    WARN("Fashion-MNIST is not installed; skipped");
    return;
  }
  ScratchDir dir("resume-cnn");
  const std::string straight = dir / "straight", resumed = dir / "resumed";
  // Step 3 overflows (injected Inf), so the skip and the scale's backoff happen before the
  // checkpoint the resumed run starts from.
  const std::vector<std::string> inject{"--set",
                                        "debug.inject_nonfinite={step: 3, tensor: 4.weight}"};
  // 8 steps with checkpoints at 4 and 8; the cosine decay starts after step 2.
  require_ok(run_cli(cnn_args(straight, 8, inject)));
  crash_copy(straight, resumed, 4);
  // Starting again into a folder that holds a run is refused and changes nothing.
  const std::string before = read_text(resumed + "/metrics.jsonl");
  const CliResult again = run_cli(cnn_args(resumed, 8, inject));
  CHECK(again.code == 2);
  CHECK(again.err.find("already holds a run") != std::string::npos);
  CHECK(read_text(resumed + "/metrics.jsonl") == before);

  require_ok(run_cli(as_resume(cnn_args(resumed, 8, inject))));
  const auto [a, b] = compare_final_checkpoints(straight, resumed, 8);
  CHECK(a["optimizer"] == b["optimizer"]);
  CHECK(a["scaler"] == b["scaler"]);
  CHECK(a["next_batch"] == b["next_batch"]);
  CHECK(a["skipped_steps"] == 1);
  CHECK(b["skipped_steps"] == 1);
  // metrics.jsonl of the resumed run has each step once, 1..8.
  CHECK(logged_steps(resumed) == std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8});
  // summary.json's train_loss is the mean of the same steps' losses (those before the
  // checkpoint came back with it), not only of the steps since the resume.
  const nlohmann::json straight_summary = read_json(straight + "/summary.json");
  const nlohmann::json resumed_summary = read_json(resumed + "/summary.json");
  CHECK(resumed_summary["train_loss"] == straight_summary["train_loss"]);
  CHECK(b["recent_losses"].size() == 8);  // step 3 overflowed in a gradient, not its loss
}

TEST_CASE("resume: fp32 and bf16 with accumulation are bit-identical", "[apps][train][resume]") {
  if (!fashion_mnist_installed()) {
    WARN("Fashion-MNIST is not installed; skipped");
    return;
  }
  for (const std::string precision : {"fp32", "bf16"}) {
    INFO("precision " << precision);
    ScratchDir dir("resume-accum-" + precision);
    const std::string straight = dir / "straight", resumed = dir / "resumed";
    // cnn_args: two microbatches of 16 a step, cosine after step 2; here 4 steps with
    // checkpoints at 2 and 4, resumed from 2.
    const std::vector<std::string> extra{"--set", "precision=" + precision,
                                         "--set", "checkpoint.every=2"};
    require_ok(run_cli(cnn_args(straight, 4, extra)));
    crash_copy(straight, resumed, 2);
    require_ok(run_cli(as_resume(cnn_args(resumed, 4, extra))));
    const auto [a, b] = compare_final_checkpoints(straight, resumed, 4);
    CHECK(a["optimizer"] == b["optimizer"]);
    CHECK(a["scaler"] == b["scaler"]);
    // Two batches a step: the data position is 2 x 4 in both.
    CHECK(a["next_batch"] == 8);
    CHECK(b["next_batch"] == 8);
    CHECK(b["skipped_steps"] == 0);
    // Neither precision scales the loss (`auto` is none for fp32 and bf16).
    CHECK(b["scaler"]["policy"]["kind"] == "none");
    // The weights moved after the checkpoint resumed from, so the comparison is not vacuous.
    CHECK_FALSE(same_bytes(checkpoint_file(resumed, 2, "model.safetensors"),
                           checkpoint_file(resumed, 4, "model.safetensors")));
    CHECK(logged_steps(resumed) == std::vector<int64_t>{1, 2, 3, 4});
  }
}

TEST_CASE("resume: a bf16 GPT with dropout is bit-identical", "[apps][train]") {
  ScratchDir dir("resume-gpt");
  const std::string straight = dir / "straight", resumed = dir / "resumed";
  require_ok(run_cli(gpt_args(straight, 6)));
  crash_copy(straight, resumed, 3);
  require_ok(run_cli(as_resume(gpt_args(resumed, 6))));
  const auto [a, b] = compare_final_checkpoints(straight, resumed, 6);
  CHECK(a["dropout_generator"] == b["dropout_generator"]);
  CHECK(a["optimizer"] == b["optimizer"]);
  // The generator moved: dropout drew masks.
  CHECK(a["dropout_generator"]["offset"].get<uint64_t>() > 0);
}

TEST_CASE("resume refuses a checkpoint of another config", "[apps][train]") {
  ScratchDir dir("resume-mismatch");
  const std::string run = dir / "run";
  require_ok(run_cli(gpt_args(run, 3)));
  auto args = as_resume(gpt_args(run, 6, {"--set", "optimizer.lr=0.5"}));
  const std::string before = read_text(run + "/metrics.jsonl");
  const CliResult r = run_cli(args);
  CHECK(r.code == 2);
  CHECK(r.err.find("another config") != std::string::npos);
  CHECK(read_text(run + "/metrics.jsonl") == before);
  // A folder without checkpoints cannot be resumed.
  fs::create_directories(dir / "empty");
  const CliResult none = run_cli(as_resume(gpt_args(dir / "empty", 6)));
  CHECK(none.code == 2);
  // Nor a checkpoint folder in place of its run folder (the run would land inside it).
  const CliResult inner = run_cli(as_resume(gpt_args(run + "/checkpoints/step_3", 6)));
  CHECK(inner.code == 2);
  CHECK(inner.err.find("not a run folder") != std::string::npos);
  // A finished run has nothing left to do at its own length, or a shorter one.
  for (int steps : {3, 2}) {
    const CliResult done = run_cli(as_resume(gpt_args(run, steps)));
    CHECK(done.code == 2);
    CHECK(done.err.find("nothing left to do") != std::string::npos);
  }
  CHECK(read_text(run + "/metrics.jsonl") == before);
}

TEST_CASE("inject_nonfinite skips exactly that step and leaves the weights bit-identical",
          "[apps][train]") {
  if (!fashion_mnist_installed()) {
    WARN("Fashion-MNIST is not installed; skipped");
    return;
  }
  ScratchDir dir("inject");
  const std::string two = dir / "two", three = dir / "three";
  // S = 1024: far from FP16's overflow on this model, so the injected Inf is the only one.
  const std::vector<std::string> scale{"--set", "loss_scale={policy: dynamic, init_scale: 1024}"};
  require_ok(run_cli(cnn_args(two, 2, scale)));
  std::vector<std::string> inject = scale;
  inject.insert(inject.end(), {"--set", "debug.inject_nonfinite={step: 3, tensor: 9.weight}"});
  require_ok(run_cli(cnn_args(three, 3, inject)));

  // Batch-norm statistics move in the forward pass of the skipped step too, as in torch;
  // the weights must not move.
  check_same_tensors(checkpoint_file(two, 2, "model.safetensors"),
                     checkpoint_file(three, 3, "model.safetensors"), true);
  const auto metrics = read_jsonl(three + "/metrics.jsonl");
  bool seen = false;
  for (const auto& r : metrics) {
    if (r["event"] != "step") continue;
    const bool is_three = r["step"] == 3;
    CHECK(r["skipped"].get<bool>() == is_three);
    if (is_three) {
      seen = true;
      CHECK(r["nonfinite_tensors"] == nlohmann::json::array({"9.weight"}));
      CHECK(r["scale"] == 1024.0);
      CHECK(r["next_scale"] == 512.0);
    }
  }
  CHECK(seen);
  CHECK(read_json(three + "/summary.json")["skipped_steps"] == 1);
  // An unknown tensor name is bad input that lists the names there are.
  const CliResult bad = run_cli(cnn_args(dir / "bad", 3, {"--set", "debug.inject_nonfinite={step: 1, tensor: nope}"}));
  CHECK(bad.code == 2);
  CHECK(bad.err.find("9.weight") != std::string::npos);
}
