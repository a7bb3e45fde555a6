// Shared by the end-to-end training tests: where the repository and its data are, a scratch
// folder per test, and the command line run in-process.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/scratch_dir.h"

#include "apps/cli.h"

namespace train_test {

namespace fs = std::filesystem;

// tests/apps/<this file> -> the repository root.
inline fs::path repo_root() { return fs::path(__FILE__).parent_path().parent_path().parent_path(); }
inline std::string config_path(const char* name) { return (repo_root() / "configs" / name).string(); }

inline bool fashion_mnist_installed() {
  return fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz");
}
inline fs::path shakespeare_path() {
  return repo_root().parent_path() / "shared" / "data" / "tinyshakespeare" / "input.txt";
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


}  // namespace train_test
