// Shared by the CUDA end-to-end training tests: a scratch folder per run, the run's
// metrics.jsonl and summary.json read back, and the small runs they train. Where the
// configs and the data are, also on a GPU machine's copy of the repository: tests/repo_data.h.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "apps/train/trainer.h"
#include "tests/repo_data.h"
#include "tests/scratch_dir.h"

namespace cuda_train_test {

namespace fs = std::filesystem;

using mixprec_test::config_path;
using mixprec_test::fashion_mnist_installed;
using mixprec_test::find_data;
using mixprec_test::kFashionMnistDir;
using mixprec_test::repo_root;

using mixprec_test::ScratchDir;
using mixprec_test::read_jsonl;

// The step records of one run by step, and its summary.
struct LoggedRun {
  std::map<int64_t, nlohmann::json> steps;
  nlohmann::json summary;
};

// `mixprec train` of `config` with `overrides` into the run folder `out_dir`, which the
// caller keeps (to read its checkpoints), through run_training; its log is dropped.
inline LoggedRun train_into(const fs::path& out_dir, const std::string& config,
                            std::vector<std::string> overrides) {
  mixprec::TrainOptions options;
  options.config_path = config;
  options.overrides = std::move(overrides);
  options.out_dir = out_dir;
  std::ostringstream log;
  LoggedRun run;
  run.summary = mixprec::run_training(options, log);
  for (const nlohmann::json& record : read_jsonl(out_dir / "metrics.jsonl")) {
    if (record.value("event", "") == "step") run.steps[record["step"].get<int64_t>()] = record;
  }
  return run;
}

// train_into a scratch folder named after `scratch`, removed again.
inline LoggedRun train_logged(const std::string& scratch, const std::string& config,
                              std::vector<std::string> overrides) {
  ScratchDir dir(scratch);
  return train_into(dir / "run", config, std::move(overrides));
}

// A value metrics.jsonl logged as a number: a JSON number as it is, a string parsed by
// strtod, anything else NaN.
inline double logged_number(const nlohmann::json& value) {
  if (value.is_number()) return value.get<double>();
  if (value.is_string()) return std::strtod(value.get<std::string>().c_str(), nullptr);
  return std::numeric_limits<double>::quiet_NaN();
}

// `overrides` followed by `more`.
inline std::vector<std::string> with(std::vector<std::string> overrides,
                                     const std::vector<std::string>& more) {
  overrides.insert(overrides.end(), more.begin(), more.end());
  return overrides;
}

// tiny shakespeare, or an empty path after a warning that the test is skipped.
inline fs::path shakespeare_or_warn() {
  const fs::path text = find_data("tinyshakespeare/input.txt");
  if (text.empty()) WARN("skipped: tiny shakespeare not found (shared/data/tinyshakespeare/input.txt)");
  return text;
}

// Overrides of gpt_shakespeare.yaml (AdamW, warmup and cosine decay, clipping at 1.0) for
// repo_data.h's small GPT, small enough for the emulated runtime, on `text`.
inline std::vector<std::string> small_gpt_overrides(const fs::path& text) {
  return with(mixprec_test::small_gpt_overrides(text),
              {"schedule.warmup_steps=2", "train.clip_grad_norm=1.0"});
}

// `base` followed by small_gpt_overrides on tiny shakespeare; empty after a warning that the
// test is skipped when tiny shakespeare is not here. Fails the test when configs/ is not found.
inline std::vector<std::string> small_gpt_run_or_warn(const std::vector<std::string>& base) {
  REQUIRE_FALSE(repo_root().empty());
  const fs::path text = shakespeare_or_warn();
  if (text.empty()) return {};
  return with(base, small_gpt_overrides(text));
}

// Writes `dir`/cnn.yaml, repo_data.h's small CNN on the MNIST test set with SGD with
// momentum, clipping at 0.5 and a dynamic scale of 1024 (65536 overflows this model's FP16
// gradients now and then), plus the YAML lines `extra`; returns its path, or an empty string
// after a warning that the test is skipped when the MNIST test set is not here.
inline std::string write_small_mnist_cnn(const fs::path& dir, const std::string& extra = "") {
  const std::string model_and_data = mixprec_test::small_mnist_cnn_yaml();
  if (model_and_data.empty()) {
    WARN("skipped: the MNIST test set is not here (shared/data/mnist)");
    return {};
  }
  const std::string config = (dir / "cnn.yaml").string();
  std::ofstream(config) << model_and_data
                        << "loss_scale: {policy: dynamic, init_scale: 1024}\n"
                           "optimizer: {type: sgd, lr: 0.05, momentum: 0.9}\n"
                           "train: {batch_size: 16, clip_grad_norm: 0.5}\n"
                        << extra;
  return config;
}

}  // namespace cuda_train_test
