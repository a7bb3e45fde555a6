// Shared by the tests that read a run's TensorBoard event files back with TensorBoard's own
// reader: scripts/read_tensorboard.py under a python3 that imports PyPI's `tensorboard`.
#pragma once

#include <cstdlib>
#include <string>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "tests/apps/torch_python.h"

namespace mixprec_test {

// A python3 that imports tensorboard, or "" when there is none, looked up once:
// MIXPREC_TENSORBOARD_PYTHON if set, else the venv scripts/setup_tests.sh installs it into
// (${XDG_CACHE_HOME:-$HOME/.cache}/mixprec/tensorboard-venv), else python_with's candidates.
inline const std::string& tensorboard_python() {
  static const std::string found = [] {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("MIXPREC_TENSORBOARD_PYTHON"); env && *env)
      candidates.push_back(env);
    const char* cache = std::getenv("XDG_CACHE_HOME");
    const char* home = std::getenv("HOME");
    if (cache && *cache) {
      candidates.push_back(std::string(cache) + "/mixprec/tensorboard-venv/bin/python");
    } else if (home && *home) {
      candidates.push_back(std::string(home) + "/.cache/mixprec/tensorboard-venv/bin/python");
    }
    for (const std::string& candidate : candidates) {
      if (exit_status(shell_quoted(candidate) + " -c 'import tensorboard' >/dev/null 2>&1") == 0)
        return candidate;
    }
    return python_with("tensorboard");
  }();
  return found;
}

// Whether tensorboard_python() found one; when not, warns that the calling test is skipped
// (the caller returns).
inline bool tensorboard_available() {
  if (!tensorboard_python().empty()) return true;
  WARN("no python3 that imports tensorboard (scripts/setup_tests.sh installs PyPI's "
       "tensorboard into a venv; it could not here, e.g. offline); skipped");
  return false;
}

// scripts/read_tensorboard.py's JSON for `logdir` (its output logged into `log_prefix`.*);
// `served`: with the scalars a running TensorBoard serves (--served).
inline nlohmann::json read_tensorboard(const std::string& logdir, const std::string& log_prefix,
                                       bool served = false) {
  std::vector<std::string> args{logdir};
  if (served) args.insert(args.begin(), "--served");
  const ScriptRun run = run_script(tensorboard_python(), "read_tensorboard.py", args,
                                   log_prefix + ".json", log_prefix + ".err");
  INFO("read_tensorboard.py: " << run.err);
  REQUIRE(run.code == 0);
  return nlohmann::json::parse(run.out);
}

}  // namespace mixprec_test
