// Shared by the end-to-end training tests: where the `mixprec` program is (the repository and
// its data: tests/repo_data.h), a scratch folder per test, the command line run in-process, and what a run
// folder holds (its checkpoints' files, the steps metrics.jsonl logged).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "tests/repo_data.h"
#include "tests/scratch_dir.h"

#include "apps/checkpoint/safetensors.h"
#include "apps/cli.h"

namespace train_test {

namespace fs = std::filesystem;

using mixprec_test::config_path;
using mixprec_test::fashion_mnist_installed;
using mixprec_test::find_data;
using mixprec_test::mnist_dir;
using mixprec_test::mnist_present;
using mixprec_test::repo_root;
using mixprec_test::shakespeare_path;

// Where the `mixprec` program of this build is: <build>/apps/mixprec beside
// <build>/tests/<this test> (built or not); empty when /proc/self/exe cannot be read.
inline fs::path mixprec_binary() {
  std::error_code error;
  const fs::path self = fs::read_symlink("/proc/self/exe", error);
  if (error) return {};
  return self.parent_path().parent_path() / "apps" / "mixprec";
}

using mixprec_test::ScratchDir;
using mixprec_test::read_jsonl;

struct CliResult {
  int code = -1;
  std::string out;
  std::string err;
};

inline CliResult run_cli(std::vector<std::string> args) {
  args.insert(args.begin(), "mixprec");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  CliResult result;
  result.code = mixprec::run_cli(static_cast<int>(argv.size()), argv.data(), out, err);
  result.out = out.str();
  result.err = err.str();
  return result;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

inline nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(read_text(path)); }

// Requires exit code 0, with the run's output in the message otherwise.
inline void require_ok(const CliResult& r) {
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.code == 0);
}

// `mixprec train config --out out`, then `extra`.
inline std::vector<std::string> train_args(const std::string& config, const std::string& out,
                                           std::vector<std::string> extra = {}) {
  std::vector<std::string> args{"train", config, "--out", out};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// The same arguments continuing the run of their --out instead of starting it.
inline std::vector<std::string> as_resume(std::vector<std::string> args) {
  for (auto& a : args) {
    if (a == "--out") a = "--resume";
  }
  return args;
}

// `file` of the checkpoint of step `step` in run folder `run`.
inline std::string checkpoint_file(const std::string& run, int step, const char* file) {
  return run + "/checkpoints/step_" + std::to_string(step) + "/" + file;
}

// Batch norm's running statistics and batch count: state that a forward pass moves.
inline bool is_batch_norm_buffer(const std::string& name) {
  return name.find("running_") != std::string::npos ||
         name.find("num_batches") != std::string::npos;
}

// Every tensor of safetensors file `b_file` has the bytes of the same tensor in `a_file`
// (batch-norm buffers too unless `skip_buffers`), and both hold as many tensors.
inline void check_same_tensors(const std::string& a_file, const std::string& b_file,
                               bool skip_buffers) {
  const auto a = mixprec::read_safetensors(a_file);
  const auto b = mixprec::read_safetensors(b_file);
  REQUIRE(a.tensors.size() == b.tensors.size());
  for (const auto& [name, tensor] : a.tensors) {
    if (skip_buffers && is_batch_norm_buffer(name)) continue;
    INFO(name);
    const mixprec::Tensor& other = b.tensors.at(name);
    REQUIRE(other.nbytes() == tensor.nbytes());
    CHECK(std::memcmp(other.data(), tensor.data(), tensor.nbytes()) == 0);
  }
}

// The step numbers of the step records in metrics.jsonl of `run`, in the order logged.
inline std::vector<int64_t> logged_steps(const std::string& run) {
  std::vector<int64_t> steps;
  for (const auto& record : read_jsonl(run + "/metrics.jsonl")) {
    if (record.at("event") == "step") steps.push_back(record.at("step").get<int64_t>());
  }
  return steps;
}

// The step records in metrics.jsonl of `run`, by step number.
inline std::map<int64_t, nlohmann::json> step_records(const std::string& run) {
  std::map<int64_t, nlohmann::json> steps;
  for (const auto& r : read_jsonl(run + "/metrics.jsonl")) {
    if (r["event"] == "step") steps[r["step"].get<int64_t>()] = r;
  }
  return steps;
}

}  // namespace train_test
