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
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

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

// `mixprec train` of `config` with `overrides` into a scratch folder named after `scratch`
// (removed again), through run_training; its log is dropped.
inline LoggedRun train_logged(const std::string& scratch, const std::string& config,
                              std::vector<std::string> overrides) {
  ScratchDir dir(scratch);
  mixprec::TrainOptions options;
  options.config_path = config;
  options.overrides = std::move(overrides);
  options.out_dir = dir / "run";
  std::ostringstream log;
  LoggedRun run;
  run.summary = mixprec::run_training(options, log);
  for (const nlohmann::json& record : read_jsonl(dir / "run/metrics.jsonl")) {
    if (record.value("event", "") == "step") run.steps[record["step"].get<int64_t>()] = record;
  }
  return run;
}

}  // namespace cuda_train_test
