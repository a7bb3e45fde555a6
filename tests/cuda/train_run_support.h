// Shared by the CUDA end-to-end training tests: where the configs and the data are, a scratch
// folder per run, and the run's metrics.jsonl and summary.json read back.
//
// The CUDA tests also run on a lent GPU machine, from a copy of the repository whose path
// differs from the one this file was compiled at, so the repository root is looked up:
// $MIXPREC_SOURCE_DIR (scripts/gpu_check.sh sets it), then the compile-time path, then the
// working directory; the first that holds configs/ wins. Data (tiny shakespeare, MNIST) is
// looked up in $MIXPREC_DATA_DIR, then <root>/shared/data, then <root>/../shared/data.
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
#include "tests/scratch_dir.h"

namespace cuda_train_test {

namespace fs = std::filesystem;

inline bool holds_configs(const fs::path& root) {
  std::error_code ignored;
  return !root.empty() && fs::exists(root / "configs" / "gpt_shakespeare.yaml", ignored);
}

// The repository root, or an empty path when none of the candidates holds configs/.
inline fs::path repo_root() {
  std::vector<fs::path> candidates;
  if (const char* env = std::getenv("MIXPREC_SOURCE_DIR"); env != nullptr && *env != '\0') {
    candidates.emplace_back(env);
  }
  // tests/cuda/<this file> -> the repository root.
  candidates.push_back(fs::path(__FILE__).parent_path().parent_path().parent_path());
  std::error_code ignored;
  candidates.push_back(fs::current_path(ignored));
  for (const fs::path& root : candidates) {
    if (holds_configs(root)) return root;
  }
  return {};
}

inline std::string config_path(const char* name) { return (repo_root() / "configs" / name).string(); }

// `relative` (e.g. "tinyshakespeare/input.txt") in the first data folder that has it; an
// empty path when none does.
inline fs::path find_data(const std::string& relative) {
  std::vector<fs::path> folders;
  if (const char* env = std::getenv("MIXPREC_DATA_DIR"); env != nullptr && *env != '\0') {
    folders.emplace_back(env);
  }
  const fs::path root = repo_root();
  if (!root.empty()) {
    folders.push_back(root / "shared" / "data");
    folders.push_back(root.parent_path() / "shared" / "data");
  }
  std::error_code ignored;
  for (const fs::path& folder : folders) {
    if (fs::exists(folder / relative, ignored)) return folder / relative;
  }
  return {};
}

inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

inline bool fashion_mnist_installed() {
  std::error_code ignored;
  return fs::exists(fs::path(kFashionMnistDir) / "train-images-idx3-ubyte.gz", ignored) &&
         fs::exists(fs::path(kFashionMnistDir) / "t10k-images-idx3-ubyte.gz", ignored);
}

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

// Overrides of gpt_shakespeare.yaml (AdamW, warmup and cosine decay, clipping at 1.0) for a
// one-layer GPT small enough for the emulated runtime, on `text`.
inline std::vector<std::string> small_gpt_overrides(const fs::path& text) {
  return {"data.path=" + text.string(), "model.n_layer=1",        "model.n_head=2",
          "model.n_embd=32",            "model.block_size=16",    "train.batch_size=4",
          "data.eval_batches=2",        "schedule.warmup_steps=2", "train.clip_grad_norm=1.0"};
}

// `base` followed by small_gpt_overrides on tiny shakespeare; empty after a warning that the
// test is skipped when tiny shakespeare is not here. Fails the test when configs/ is not found.
inline std::vector<std::string> small_gpt_run_or_warn(const std::vector<std::string>& base) {
  REQUIRE_FALSE(repo_root().empty());
  const fs::path text = shakespeare_or_warn();
  if (text.empty()) return {};
  return with(base, small_gpt_overrides(text));
}

// Writes `dir`/cnn.yaml, a small CNN with batch norm on 256 images of the MNIST test set, SGD
// with momentum, clipping at 0.5 and a dynamic scale of 1024 (65536 overflows this model's
// FP16 gradients now and then), plus the YAML lines `extra`; returns its path, or an empty
// string after a warning that the test is skipped when the MNIST test set is not here.
inline std::string write_small_mnist_cnn(const fs::path& dir, const std::string& extra = "") {
  const fs::path images = find_data("mnist/t10k-images-idx3-ubyte.gz");
  const fs::path labels = find_data("mnist/t10k-labels-idx1-ubyte.gz");
  if (images.empty() || labels.empty()) {
    WARN("skipped: the MNIST test set is not here (shared/data/mnist)");
    return {};
  }
  const std::string config = (dir / "cnn.yaml").string();
  std::ofstream(config)
      << "model:\n  type: cnn\n  in_channels: 1\n  input_size: 28\n"
         "  layers: [{conv: 4, kernel: 3}, batchnorm, relu, {maxpool: 2}, flatten, {linear: 10}]\n"
         "data:\n  train_images: " << images.string() << "\n  train_labels: " << labels.string()
      << "\n  test_images: " << images.string() << "\n  test_labels: " << labels.string()
      << "\n  limit_train: 256\n  limit_test: 32\n"
         "loss_scale: {policy: dynamic, init_scale: 1024}\n"
         "optimizer: {type: sgd, lr: 0.05, momentum: 0.9}\n"
         "train: {batch_size: 16, clip_grad_norm: 0.5}\n"
      << extra;
  return config;
}

}  // namespace cuda_train_test
