// train.host_reads: a run that reads each step's outcome only at log, eval and checkpoint
// steps (at_log, amp/deferred_steps.h) takes exactly the steps of one that reads it after every
// step (per_step). Each scenario trains twice on the CPU, once each way, and compares every
// metrics record, summary.json and every checkpoint (model.safetensors byte for byte,
// state.json field for field). Only timing fields differ, and grad_norm, which at_log reads
// as FP32 (1e-6 relative).
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <map>
#include <numbers>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "apps/config/train_config.h"
#include "apps/train/trainer.h"
#include "apps/train/training_stopped.h"
#include "core/error.h"
#include "train_test_support.h"

using namespace train_test;

namespace {

constexpr const char* kModes[] = {"per_step", "at_log"};

// repo_data.h's small CNN on the MNIST test set, FP16 with a dynamic scale of 1024 that
// grows every 2 good steps (so it moves inside a window of deferred steps), SGD with momentum,
// two microbatches a step, clipping at 0.5; logs every 4 steps, evaluates every 5, saves every
// 3, 12 steps.
std::string cnn_config() {
  return mixprec_test::small_mnist_cnn_yaml() +
         "precision: fp16\n"
         "loss_scale: {policy: dynamic, init_scale: 1024, growth_interval: 2}\n"
         "optimizer: {type: sgd, lr: 0.05, momentum: 0.9}\n"
         "train: {steps: 12, batch_size: 16, accumulation_steps: 2, clip_grad_norm: 0.5,\n"
         "        log_every: 4, eval_every: 5}\n"
         "checkpoint: {every: 3, keep: 0}\n"
         "device: cpu\n";
}

// repo_data.h's small GPT on tiny shakespeare with dropout, FP16 (dynamic scale), AdamW with 2
// warmup steps then cosine decay over the run, clipping at 1.0; logs every 5 steps, 11 steps.
std::vector<std::string> fp16_gpt_args(const std::string& out,
                                       std::vector<std::string> extra = {}) {
  std::vector<std::string> args = train_args(
      config_path("gpt_shakespeare.yaml"), out,
      mixprec_test::as_set_args(mixprec_test::small_gpt_overrides(shakespeare_path())));
  const std::vector<std::string> own = mixprec_test::as_set_args(
      {"model.dropout=0.1", "precision=fp16", "train.steps=11", "train.clip_grad_norm=1.0",
       "train.log_every=5", "train.eval_every=0", "checkpoint.every=0", "checkpoint.keep=0",
       "schedule.warmup_steps=2", "device=cpu"});
  args.insert(args.end(), own.begin(), own.end());
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

std::vector<std::string> with_mode(std::vector<std::string> args, const std::string& mode) {
  args.push_back("--set");
  args.push_back("train.host_reads=" + mode);
  return args;
}

// Fields that measure time (and host_syncs_per_step, which only a GPU run has): they differ
// between any two runs. run_dir names the folder.
const std::set<std::string> kTimingFields{"step_ms",        "elapsed_s",     "samples_per_s",
                                          "tokens_per_s",   "median_step_ms", "train_seconds",
                                          "host_syncs_per_step", "run_dir"};

std::string shown(const nlohmann::json& value) { return value.is_null() ? "absent" : value.dump(); }

// grad_norm: per_step computes the clip norm in double, at_log reads it as float.
bool same_grad_norm(const nlohmann::json& a, const nlohmann::json& b) {
  if (!a.is_number() || !b.is_number()) return a == b;
  const double x = a.get<double>(), y = b.get<double>();
  return std::fabs(x - y) <= 1e-6 * std::max(std::fabs(x), std::fabs(y));
}

// Every field of two JSON objects that differs, as "<where>: <key> per_step <a>, at_log <b>".
void object_differences(const nlohmann::json& a, const nlohmann::json& b, const std::string& where,
                        std::vector<std::string>& out, const std::set<std::string>& ignored = {}) {
  std::set<std::string> keys;
  for (const auto& [key, value] : a.items()) keys.insert(key);
  for (const auto& [key, value] : b.items()) keys.insert(key);
  for (const std::string& key : keys) {
    if (kTimingFields.count(key) != 0 || ignored.count(key) != 0) continue;
    const nlohmann::json x = a.contains(key) ? a.at(key) : nlohmann::json();
    const nlohmann::json y = b.contains(key) ? b.at(key) : nlohmann::json();
    const bool same = key == "grad_norm" ? same_grad_norm(x, y) : x == y;
    if (!same) out.push_back(where + ": " + key + " per_step " + shown(x) + ", at_log " + shown(y));
  }
}

// state.json repeats the resolved config, which names train.host_reads: compared without
// that line.
std::string config_without_host_reads(const nlohmann::json& text) {
  std::istringstream in(text.is_string() ? text.get<std::string>() : text.dump());
  std::string kept;
  for (std::string line; std::getline(in, line);) {
    if (line.find("host_reads:") == std::string::npos) kept += line + "\n";
  }
  return kept;
}

std::set<std::string> checkpoint_names(const std::string& run) {
  std::set<std::string> names;
  if (!fs::exists(run + "/checkpoints")) return names;
  for (const auto& entry : fs::directory_iterator(run + "/checkpoints")) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

// Everything that differs between run folders `a` (per_step) and `b` (at_log): each metrics
// record in order, summary.json (when both have one) and every checkpoint; fields named in
// `ignored` are left out of the records and the summary.
std::vector<std::string> run_differences(const std::string& a, const std::string& b,
                                         const std::set<std::string>& ignored = {}) {
  std::vector<std::string> out;
  const auto ra = read_jsonl(a + "/metrics.jsonl");
  const auto rb = read_jsonl(b + "/metrics.jsonl");
  if (ra.size() != rb.size()) {
    out.push_back("metrics.jsonl: per_step has " + std::to_string(ra.size()) + " records, at_log " +
                  std::to_string(rb.size()));
  }
  for (size_t i = 0; i < std::min(ra.size(), rb.size()); ++i) {
    const std::string where = "record " + std::to_string(i) + " (" +
                              ra[i].value("event", "?") + " " + shown(ra[i].value("step", nlohmann::json())) + ")";
    object_differences(ra[i], rb[i], where, out, ignored);
  }
  const bool summary_a = fs::exists(a + "/summary.json"), summary_b = fs::exists(b + "/summary.json");
  if (summary_a != summary_b) out.push_back("summary.json written by only one run");
  if (summary_a && summary_b) {
    object_differences(read_json(a + "/summary.json"), read_json(b + "/summary.json"),
                       "summary.json", out, ignored);
  }
  const std::set<std::string> names = checkpoint_names(a);
  if (names != checkpoint_names(b)) out.push_back("the runs saved different checkpoints");
  for (const std::string& name : names) {
    const std::string da = a + "/checkpoints/" + name, db = b + "/checkpoints/" + name;
    if (!fs::exists(db)) continue;
    const std::string wa = read_text(da + "/model.safetensors");
    if (wa.empty() || wa != read_text(db + "/model.safetensors")) {
      out.push_back(name + "/model.safetensors: the weights differ");
    }
    nlohmann::json sa = read_json(da + "/state.json"), sb = read_json(db + "/state.json");
    if (config_without_host_reads(sa["config"]) != config_without_host_reads(sb["config"])) {
      out.push_back(name + "/state.json: config differs beyond host_reads");
    }
    sa.erase("config");
    sb.erase("config");
    object_differences(sa, sb, name + "/state.json", out);
  }
  return out;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text += line + "\n";
  return text;
}

// Trains `args` once per mode into <dir>/per_step and <dir>/at_log; both must succeed.
void train_both_ways(const ScratchDir& dir,
                     const std::function<std::vector<std::string>(const std::string&)>& args) {
  for (const char* mode : kModes) {
    INFO("train.host_reads=" << mode);
    require_ok(run_cli(with_mode(args(dir / mode), mode)));
  }
}

void require_same_runs(const std::string& per_step, const std::string& at_log,
                       const std::set<std::string>& ignored = {}) {
  const std::vector<std::string> differences = run_differences(per_step, at_log, ignored);
  INFO("per_step against at_log:\n" << joined(differences));
  CHECK(differences.empty());
}

std::vector<int64_t> eval_steps(const std::string& run) {
  std::vector<int64_t> steps;
  for (const auto& r : read_jsonl(run + "/metrics.jsonl")) {
    if (r["event"] == "eval") steps.push_back(r["step"].get<int64_t>());
  }
  return steps;
}

// The warmup-cosine rate after `taken` updates (PyTorch's/nanoGPT's formula): linear warmup
// to `base` over `warmup` updates, then a half cosine from base to min_lr ending at `decay`.
double warmup_cosine(int64_t taken, double base, int64_t warmup, int64_t decay, double min_lr) {
  if (taken < warmup) return base * static_cast<double>(taken + 1) / static_cast<double>(warmup);
  if (taken > decay) return min_lr;
  const double ratio = static_cast<double>(taken - warmup) / static_cast<double>(decay - warmup);
  return min_lr + 0.5 * (1.0 + std::cos(std::numbers::pi * ratio)) * (base - min_lr);
}

}  // namespace

TEST_CASE("host reads: train.host_reads takes auto, per_step or at_log and names them otherwise",
          "[apps][train]") {
  if (!mnist_present()) {
    WARN("MNIST test set not found at " << mnist_dir() << "; skipped");
    return;
  }
  ScratchDir dir("host-reads-config");
  const std::string config = dir / "config.yaml";
  write_text(config, cnn_config());
  CHECK(mixprec::load_train_config(config).train.host_reads == "auto");
  for (const char* mode : {"auto", "per_step", "at_log"}) {
    CHECK(mixprec::load_train_config(config, {std::string("train.host_reads=") + mode})
              .train.host_reads == mode);
  }
  // The message names the key, every choice and the value given.
  const auto names_choices = [](const std::function<void()>& load) {
    std::string message;
    try {
      load();
    } catch (const mixprec::Error& e) {
      message = e.what();
    }
    INFO(message);
    CHECK(message.find("train.host_reads must be one of auto, per_step, at_log, got 'sometimes'") !=
          std::string::npos);
  };
  names_choices([&] { mixprec::load_train_config(config, {"train.host_reads=sometimes"}); });
  // In the file itself, and through the command line (bad input: exit code 2, no run folder).
  std::string text = cnn_config();
  text.replace(text.find("log_every: 4"), 12, "log_every: 4, host_reads: sometimes");
  write_text(dir / "bad.yaml", text);
  names_choices([&] { mixprec::load_train_config(dir / "bad.yaml"); });
  const CliResult r = run_cli(train_args(dir / "bad.yaml", dir / "run"));
  CHECK(r.code == 2);
  CHECK(r.err.find("train.host_reads") != std::string::npos);
  CHECK_FALSE(fs::exists(dir / "run"));

  // The run folder's resolved config carries the setting, and loads back to it.
  const std::string run = dir / "at_log";
  require_ok(run_cli(with_mode(train_args(config, run, {"--set", "train.steps=1"}), "at_log")));
  CHECK(read_text(run + "/config.yaml").find("host_reads: at_log") != std::string::npos);
  CHECK(mixprec::load_train_config(run + "/config.yaml").train.host_reads == "at_log");
  // The default is written out too.
  CHECK(mixprec::to_yaml(mixprec::load_train_config(config)).find("host_reads: auto") !=
        std::string::npos);
}

TEST_CASE("host reads: a CNN with a skipped step mid-run is identical per step and at log steps",
          "[apps][train]") {
  if (!mnist_present()) {
    WARN("MNIST test set not found at " << mnist_dir() << "; skipped");
    return;
  }
  ScratchDir dir("host-reads-cnn");
  const std::string config = dir / "config.yaml";
  write_text(config, cnn_config());
  train_both_ways(dir, [&](const std::string& out) {
    return train_args(config, out, {"--set", "debug.inject_nonfinite={step: 6, tensor: 5.weight}"});
  });
  require_same_runs(dir / "per_step", dir / "at_log");

  // What both logged, worked out by hand: log steps 1, 4, 8, 12 and the skipped step 6;
  // evaluations at 5, 10 and the end; checkpoints every 3 steps.
  for (const char* mode : kModes) {
    INFO(mode);
    const std::string run = dir / mode;
    CHECK(logged_steps(run) == std::vector<int64_t>{1, 4, 6, 8, 12});
    CHECK(eval_steps(run) == std::vector<int64_t>{5, 10, 12});
    CHECK(checkpoint_names(run) ==
          std::set<std::string>{"step_3", "step_6", "step_9", "step_12"});
    const auto steps = step_records(run);
    // The scale grows after every 2 good steps: 1024 -> 2048 (step 2) -> 4096 (step 4); step
    // 6 overflows at 4096 and backs off to 2048; then 4096 (8), 8192 (10), 16384 (12).
    const nlohmann::json& skipped = steps.at(6);
    CHECK(skipped["skipped"].get<bool>());
    CHECK(skipped["found_inf"].get<bool>());
    CHECK(skipped["nonfinite_tensors"] == nlohmann::json::array({"5.weight"}));
    CHECK(skipped["scale"] == 4096.0);
    CHECK(skipped["next_scale"] == 2048.0);
    CHECK(skipped["skipped_in_a_row"] == 1);
    CHECK(steps.at(4)["next_scale"] == 4096.0);
    CHECK(steps.at(8)["next_scale"] == 4096.0);
    CHECK(steps.at(12)["next_scale"] == 16384.0);
    CHECK_FALSE(steps.at(8)["skipped"].get<bool>());
    const nlohmann::json summary = read_json(run + "/summary.json");
    CHECK(summary["skipped_steps"] == 1);
    CHECK(summary["final_scale"] == 16384.0);
    // The clip acted: a norm above 0.5 was logged.
    bool clipped = false;
    for (const auto& [step, record] : steps) {
      if (record["grad_norm"].is_number() && record["grad_norm"].get<double>() > 0.5) clipped = true;
    }
    CHECK(clipped);
  }
}

TEST_CASE("host reads: a skipped first update leaves the momentum to the first taken step",
          "[apps][train]") {
  if (!mnist_present()) {
    WARN("MNIST test set not found at " << mnist_dir() << "; skipped");
    return;
  }
  ScratchDir dir("host-reads-first");
  const std::string config = dir / "config.yaml";
  write_text(config, cnn_config());
  // SGD's momentum buffer starts as the first update's gradient (PyTorch); with step 1
  // skipped on the device that must be step 2's. The weights at every checkpoint show it.
  train_both_ways(dir, [&](const std::string& out) {
    return train_args(config, out, {"--set", "debug.inject_nonfinite={step: 1, tensor: 0.weight}",
                                    "--set", "train.steps=6"});
  });
  require_same_runs(dir / "per_step", dir / "at_log");
  for (const char* mode : kModes) {
    INFO(mode);
    const auto steps = step_records(dir / mode);
    const nlohmann::json& first = steps.at(1);
    CHECK(first["skipped"].get<bool>());
    CHECK(first["nonfinite_tensors"] == nlohmann::json::array({"0.weight"}));
    CHECK(first["scale"] == 1024.0);
    CHECK(first["next_scale"] == 512.0);
    const nlohmann::json state = read_json(checkpoint_file(dir / mode, 6, "state.json"));
    CHECK(state["skipped_steps"] == 1);
    CHECK(read_json(dir / mode + "/summary.json")["skipped_steps"] == 1);
  }
}

TEST_CASE("host reads: a GPT with an Inf loss under warmup and cosine is identical at log steps",
          "[apps][train]") {
  ScratchDir dir("host-reads-gpt");
  train_both_ways(dir, [&](const std::string& out) {
    return fp16_gpt_args(out, {"--set", "debug.inject_nonfinite={step: 3, tensor: loss}"});
  });
  require_same_runs(dir / "per_step", dir / "at_log");

  // The schedule counts taken updates only: step k has taken k updates before step 3 and
  // k - 1 from step 3 on. gpt_shakespeare.yaml: lr 0.002, min_lr 0.0002; warmup 2; the
  // cosine ends with the run (11 steps).
  const auto lr_after = [](int64_t taken) { return warmup_cosine(taken, 0.002, 2, 11, 0.0002); };
  for (const char* mode : kModes) {
    INFO(mode);
    const std::string run = dir / mode;
    CHECK(logged_steps(run) == std::vector<int64_t>{1, 3, 5, 10, 11});
    const auto steps = step_records(run);
    const nlohmann::json& skipped = steps.at(3);
    CHECK(skipped["skipped"].get<bool>());
    CHECK(skipped["loss"] == "inf");
    CHECK(skipped["nonfinite_loss"].get<bool>());
    CHECK(skipped["reason"].get<std::string>().rfind("non-finite loss (inf); ", 0) == 0);
    CHECK(skipped["scale"] == 65536.0);
    CHECK(skipped["next_scale"] == 32768.0);
    CHECK(skipped["lr"].get<double>() == Approx(lr_after(2)).epsilon(1e-12));
    for (int64_t step : {1, 5, 10, 11}) {
      INFO("step " << step);
      const nlohmann::json& r = steps.at(step);
      CHECK_FALSE(r["skipped"].get<bool>());
      CHECK_FALSE(r["nonfinite_loss"].get<bool>());
      CHECK(r["loss"].is_number());
      CHECK(r["train_loss"].is_number());
      CHECK(r["grad_norm"].is_number());
      CHECK(r["lr"].get<double>() == Approx(lr_after(step < 3 ? step : step - 1)).epsilon(1e-12));
    }
    CHECK(read_json(run + "/summary.json")["skipped_steps"] == 1);
  }
  // at_log times each step as an equal share of its window: steps 3 and 5 share steps 2-5.
  const auto deferred = step_records(dir / "at_log");
  CHECK(deferred.at(3)["step_ms"] == deferred.at(5)["step_ms"]);
}

TEST_CASE("host reads: an input batch with NaN finishes the pending steps before it",
          "[apps][train]") {
  if (!mnist_present()) {
    WARN("MNIST test set not found at " << mnist_dir() << "; skipped");
    return;
  }
  ScratchDir dir("host-reads-input");
  const std::string config = dir / "config.yaml";
  write_text(config, cnn_config());
  // log_every 10 and nothing else in between: steps 2 and 3 are still on the device when
  // step 4's input turns out bad.
  train_both_ways(dir, [&](const std::string& out) {
    return train_args(config, out,
                      {"--set", "debug.inject_nonfinite={step: 4, tensor: input, value: nan}",
                       "--set", "train.steps=6", "--set", "train.log_every=10",
                       "--set", "train.eval_every=0", "--set", "checkpoint.every=0"});
  });
  require_same_runs(dir / "per_step", dir / "at_log");
  for (const char* mode : kModes) {
    INFO(mode);
    const std::string run = dir / mode;
    CHECK(logged_steps(run) == std::vector<int64_t>{1, 4, 6});
    const nlohmann::json r = step_records(run).at(4);
    // Two microbatches a step: step 4 is made of batches 6 and 7.
    CHECK(r["skipped"].get<bool>());
    CHECK(r["reason"] == "input batch 6 has a non-finite value (nan) at element 0");
    CHECK(r["input_batch"] == 6);
    CHECK(r["loss"].is_null());
    // Not an overflow; steps 1-3 were good, so the scale grew after step 2 and the
    // growth count stands at 1 (step 3).
    CHECK_FALSE(r["found_inf"].get<bool>());
    CHECK(r["scale"] == 2048.0);
    CHECK(r["next_scale"] == 2048.0);
    CHECK(r["growth_tracker"] == 1);
    CHECK(read_json(run + "/summary.json")["skipped_steps"] == 1);
  }
}

TEST_CASE("host reads: a run whose every step overflows stops at the same step in both modes",
          "[apps][train]") {
  if (!mnist_present()) {
    WARN("MNIST test set not found at " << mnist_dir() << "; skipped");
    return;
  }
  ScratchDir dir("host-reads-stop");
  const std::string config = dir / "config.yaml";
  write_text(config, cnn_config());
  // S = 2^30 overflows FP16 in every backward pass of this model, and may back off only to
  // 2^28 (see "nonfinite: a run whose every step overflows stops after max_consecutive_skips").
  // Without clipping or growth, so only the overflows matter.
  const std::vector<std::string> overflow{
      "loss_scale={policy: dynamic, init_scale: 1073741824.0, max_scale: 1073741824.0, "
      "min_scale: 268435456.0}",
      "train.steps=20", "train.log_every=10", "train.eval_every=0", "train.clip_grad_norm=0",
      "train.max_consecutive_skips=3", "checkpoint.every=0", "checkpoint.save_initial=true"};
  // per_step stops at the third skip. at_log reads at step 1 (always logged) and, once a step
  // was skipped, after every step until one is taken: it stops at the third skip too.
  const std::map<std::string, int64_t> stop_step{{"per_step", 3}, {"at_log", 3}};
  std::map<std::string, std::vector<nlohmann::json>> records;
  for (const char* mode : kModes) {
    INFO(mode);
    const std::string run = dir / mode;
    const int64_t stop = stop_step.at(mode);
    mixprec::TrainOptions options;
    options.config_path = config;
    options.out_dir = run;
    options.overrides = overflow;
    options.overrides.push_back(std::string("train.host_reads=") + mode);
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
      CHECK(message.find("training stopped at step " + std::to_string(stop) + ": " +
                         std::to_string(stop) + " steps in a row") != std::string::npos);
      CHECK(message.find("the weights are those after step 0") != std::string::npos);
    }
    CHECK(diagnostic["event"] == "stopped");
    CHECK(diagnostic["step"] == stop);
    CHECK(diagnostic["skipped_in_a_row"] == stop);
    CHECK(diagnostic["max_consecutive_skips"] == 3);
    CHECK(diagnostic["first_skipped_step"] == 1);
    CHECK(diagnostic["last_applied_step"] == 0);
    // One halving per overflow, down to the floor 2^28.
    CHECK(diagnostic["scale"] == std::max(std::ldexp(1.0, 30 - static_cast<int>(stop)),
                                          std::ldexp(1.0, 28)));
    CHECK(checkpoint == run + "/checkpoints/step_" + std::to_string(stop));
    // The checkpoint holds the weights of the last applied step: the initial ones.
    check_same_tensors(checkpoint_file(run, 0, "model.safetensors"),
                       checkpoint_file(run, static_cast<int>(stop), "model.safetensors"), true);
    const nlohmann::json state = read_json(checkpoint_file(run, static_cast<int>(stop), "state.json"));
    CHECK(state["step"] == stop);
    CHECK(state["skipped_steps"] == stop);
    CHECK(state["next_batch"] == 2 * stop);
    std::vector<int64_t> expected_steps;
    for (int64_t s = 1; s <= stop; ++s) expected_steps.push_back(s);
    CHECK(logged_steps(run) == expected_steps);
    records[mode] = read_jsonl(run + "/metrics.jsonl");
    REQUIRE_FALSE(records[mode].empty());
    CHECK(records[mode].back() == diagnostic);
  }
  // The steps both took are recorded alike.
  std::vector<std::string> differences;
  for (size_t i = 0; i < 3; ++i) {
    object_differences(records["per_step"].at(i), records["at_log"].at(i),
                       "record " + std::to_string(i), differences);
  }
  INFO(joined(differences));
  CHECK(differences.empty());
}

TEST_CASE("host reads: skips past the limit stop an at_log run where per_step stops",
          "[apps][train]") {
  if (!mnist_present()) {
    WARN("MNIST test set not found at " << mnist_dir() << "; skipped");
    return;
  }
  ScratchDir dir("host-reads-recover");
  const std::string config = dir / "config.yaml";
  write_text(config, cnn_config());
  // S = 2^30 with the floor at 1: the scale halves at each overflow until the gradients fit
  // FP16 (around 2^17 on this model), far more than 3 skips in a row, then steps are taken.
  // log_every 20 would read only at steps 1 and 20; the skip at step 1 makes at_log read after
  // every step until one is taken, so it cannot run past the limit into the recovery.
  const std::vector<std::string> overflow{
      "--set", "loss_scale={policy: dynamic, init_scale: 1073741824.0, "
               "max_scale: 1073741824.0, min_scale: 1}",
      "--set", "train.steps=20", "--set", "train.log_every=20", "--set", "train.eval_every=0",
      "--set", "train.clip_grad_norm=0", "--set", "train.max_consecutive_skips=3",
      "--set", "checkpoint.every=0"};
  const CliResult per_step = run_cli(with_mode(train_args(config, dir / "per_step", overflow), "per_step"));
  INFO("per_step stderr: " << per_step.err);
  CHECK(per_step.code == 3);
  CHECK(per_step.err.rfind("error: training stopped at step 3: 3 steps in a row", 0) == 0);

  const CliResult at_log = run_cli(with_mode(train_args(config, dir / "at_log", overflow), "at_log"));
  INFO("at_log exit code " << at_log.code << ", stderr: " << at_log.err);
  int64_t most_in_a_row = 0;
  for (const auto& [step, record] : step_records(dir / "at_log")) {
    most_in_a_row = std::max(most_in_a_row, record["skipped_in_a_row"].get<int64_t>());
  }
  INFO("most skips in a row logged by at_log: " << most_in_a_row);
  REQUIRE(most_in_a_row >= 3);
  CHECK(at_log.code == 3);
  CHECK(at_log.err.rfind("error: training stopped at step 3: 3 steps in a row", 0) == 0);
  CHECK(most_in_a_row == 3);
}

TEST_CASE("host reads: an at_log run resumed from its checkpoint equals a per_step run",
          "[apps][train]") {
  if (!mnist_present()) {
    WARN("MNIST test set not found at " << mnist_dir() << "; skipped");
    return;
  }
  ScratchDir dir("host-reads-resume");
  const std::string config = dir / "config.yaml";
  write_text(config, cnn_config());
  // 6 steps, step 5 overflowing (after the checkpoint at 3, which the resumed run reads).
  const auto args = [&](const std::string& out) {
    return train_args(config, out, {"--set", "train.steps=6",
                                    "--set", "debug.inject_nonfinite={step: 5, tensor: 5.weight}"});
  };
  // Each mode trains 6 steps, loses what came after the checkpoint of step 3 (as a crash
  // right after it would leave the folder: step 6's checkpoint and the summary gone,
  // metrics.jsonl with later lines that the resumed run replaces) and resumes to 6.
  for (const char* mode : kModes) {
    INFO(mode);
    const std::string run = dir / mode;
    require_ok(run_cli(with_mode(args(run), mode)));
    fs::remove(run + "/summary.json");
    fs::remove_all(run + "/checkpoints/step_6");
    require_ok(run_cli(as_resume(with_mode(args(run), mode))));
  }
  require_same_runs(dir / "per_step", dir / "at_log");
  // And the resumed at_log run equals a per_step run straight through, but for the log
  // records' train_loss (the mean since the previous log line), whose window a resumed run
  // starts afresh. summary.json's train_loss, the last 50 steps, came back with the
  // checkpoint's recent losses.
  const std::string straight = dir / "straight", resumed = dir / "at_log";
  require_ok(run_cli(with_mode(args(straight), "per_step")));
  require_same_runs(straight, resumed, {"train_loss"});
  CHECK(read_json(resumed + "/summary.json")["train_loss"] ==
        read_json(straight + "/summary.json")["train_loss"]);
  CHECK(logged_steps(resumed) == std::vector<int64_t>{1, 4, 5, 6});
  CHECK(read_json(checkpoint_file(resumed, 6, "state.json"))["skipped_steps"] == 1);
  // The weights moved after the checkpoint resumed from.
  CHECK(read_text(checkpoint_file(resumed, 3, "model.safetensors")) !=
        read_text(checkpoint_file(resumed, 6, "model.safetensors")));
}

TEST_CASE("host reads: a run of skips that starts between reads stops where per_step stops",
          "[apps][train]") {
  if (!mnist_present()) {
    WARN("MNIST test set not found at " << mnist_dir() << "; skipped");
    return;
  }
  ScratchDir dir("host-reads-mid-window");
  const std::string config = dir / "config.yaml";
  write_text(config, cnn_config());
  // The scale quadruples after every good step from 2^12 until the backward overflows, and a
  // hysteresis of 10 keeps it there, so the skips run on. log_every 20 reads at step 1 only;
  // the skips start between reads, and at_log must still stop at the third of them.
  const std::vector<std::string> overrides{
      "--set", "loss_scale={policy: dynamic, init_scale: 4096.0, growth_factor: 4.0, "
               "growth_interval: 1, hysteresis: 10, max_scale: 1073741824.0}",
      "--set", "train.steps=20", "--set", "train.log_every=20", "--set", "train.eval_every=0",
      "--set", "train.clip_grad_norm=0", "--set", "train.max_consecutive_skips=3",
      "--set", "checkpoint.every=0"};
  const CliResult per_step = run_cli(with_mode(train_args(config, dir / "per_step", overrides), "per_step"));
  INFO("per_step exit code " << per_step.code << ", stderr: " << per_step.err);
  REQUIRE(per_step.code == 3);
  const CliResult at_log = run_cli(with_mode(train_args(config, dir / "at_log", overrides), "at_log"));
  INFO("at_log exit code " << at_log.code << ", stderr: " << at_log.err);
  CHECK(at_log.code == 3);
  // The same message, but for the run folder it names.
  std::string expected = per_step.err;
  for (size_t at = expected.find("/per_step/"); at != std::string::npos;
       at = expected.find("/per_step/", at))
    expected.replace(at, 10, "/at_log/");
  CHECK(at_log.err == expected);
  // The run of skips began after step 2, between the reads at steps 1 and 20.
  const std::map<int64_t, nlohmann::json> steps = step_records(dir / "per_step");
  REQUIRE_FALSE(steps.empty());
  const int64_t first_skip = steps.rbegin()->first - 3 + 1;
  CHECK(first_skip > 2);
  CHECK(steps.at(first_skip)["skipped"] == true);
  // Steps between log steps are recorded only when skipped.
  CHECK(steps.count(first_skip - 1) == 0);
  require_same_runs(dir / "per_step", dir / "at_log", {"checkpoint", "message"});
}
