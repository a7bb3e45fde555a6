// Exit codes and messages of the mixprec command line.
#include <catch2/catch.hpp>

#include <sstream>
#include <string>
#include <vector>

#include "apps/cli.h"

namespace {

struct CliResult {
  int code = -1;
  std::string out;
  std::string err;
};

CliResult run(std::vector<const char*> args) {
  args.insert(args.begin(), "mixprec");
  std::ostringstream out;
  std::ostringstream err;
  CliResult result;
  result.code = mixprec::run_cli(static_cast<int>(args.size()), args.data(), out, err);
  result.out = out.str();
  result.err = err.str();
  return result;
}

size_t line_count(const std::string& text) {
  size_t lines = 0;
  for (char c : text) lines += c == '\n';
  return lines;
}

}  // namespace

TEST_CASE("mixprec explain formats prints the lesson", "[apps][cli]") {
  const CliResult r = run({"explain", "formats"});
  CHECK(r.code == 0);
  CHECK(r.err.empty());
  CHECK(r.out.find("65504") != std::string::npos);
}

TEST_CASE("mixprec --version prints the version and succeeds", "[apps][cli]") {
  const CliResult r = run({"--version"});
  CHECK(r.code == 0);
  CHECK(r.out.find("mixprec ") != std::string::npos);
}

TEST_CASE("mixprec device reports without failing", "[apps][cli]") {
  const CliResult r = run({"device"});
  CHECK(r.code == 0);
#if MIXPREC_WITH_CUDA
  CHECK(r.out.find("cuDNN") != std::string::npos);
#else
  CHECK(r.out == "built without CUDA\n");
#endif
}

TEST_CASE("bad command lines exit with 2 and one message on stderr", "[apps][cli]") {
  for (const auto& args : std::vector<std::vector<const char*>>{
           {"frobnicate"}, {}, {"explain"}, {"explain", "colours"}, {"--no-such-flag"}}) {
    const CliResult r = run(args);
    std::string command_line = "mixprec";
    for (const char* arg : args) command_line += std::string(" ") + arg;
    INFO(command_line << " -> stderr: " << r.err);
    CHECK(r.code == 2);
    CHECK(r.out.empty());
    CHECK(r.err.rfind("error: ", 0) == 0);
    CHECK(line_count(r.err) == 1);
  }
}
