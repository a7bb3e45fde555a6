// Shared by the tests that run a PyTorch script of scripts/: a python3 that imports what the
// script needs, and the script run through the shell with its output in files.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/apps/train_test_support.h"

namespace mixprec_test {

// `s` as one shell word (`s` holds no single quote).
inline std::string shell_quoted(const std::string& s) { return "'" + s + "'"; }

// The exit status of a shell command (-1 when it did not exit normally).
inline int exit_status(const std::string& command) {
  const int status = std::system(command.c_str());
  return status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A python3 that imports `modules` ("torch, yaml"), or "" when there is none, looked up once
// per `modules`: MIXPREC_PYTHON if set, else `python3` on the PATH, else /usr/bin/python3
// (Debian's python3-torch lives there, and a python3 earlier on the PATH may be another
// installation without it).
inline const std::string& python_with(const std::string& modules) {
  static std::map<std::string, std::string> found;
  if (const auto known = found.find(modules); known != found.end()) return known->second;
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("MIXPREC_PYTHON"); env && *env) candidates.push_back(env);
  candidates.push_back("python3");
  candidates.push_back("/usr/bin/python3");
  std::string& python = found[modules];
  for (const std::string& candidate : candidates) {
    if (exit_status(candidate + " -c 'import " + modules + "' >/dev/null 2>&1") == 0) {
      python = candidate;
      break;
    }
  }
  return python;
}

// Whether python_with(`modules`) finds a python3; when not, warns that the calling test is
// skipped (the caller returns).
inline bool python_available(const std::string& modules) {
  if (!python_with(modules).empty()) return true;
  WARN("no python3 that imports " << modules
       << " (scripts/setup.sh installs python3-torch); skipped");
  return false;
}

struct ScriptRun {
  int code = -1;    // the exit status, -1 when the script did not exit normally
  std::string out;  // stdout (and stderr when they share a log)
  std::string err;  // stderr, "" when it went into the stdout log
};

// Runs scripts/<script> under `python` with `args` (each one word): stdout into `out_log`,
// stderr into `err_log`, or into `out_log` too when `err_log` is "".
inline ScriptRun run_script(const std::string& python, const std::string& script,
                            const std::vector<std::string>& args, const std::string& out_log,
                            const std::string& err_log = "") {
  std::ostringstream command;
  command << python << ' ' << shell_quoted((train_test::repo_root() / "scripts" / script).string());
  for (const std::string& a : args) command << ' ' << shell_quoted(a);
  command << " >" << shell_quoted(out_log);
  if (err_log.empty()) {
    command << " 2>&1";
  } else {
    command << " 2>" << shell_quoted(err_log);
  }
  ScriptRun run;
  run.code = exit_status(command.str());
  run.out = train_test::read_text(out_log);
  if (!err_log.empty()) run.err = train_test::read_text(err_log);
  return run;
}

}  // namespace mixprec_test
