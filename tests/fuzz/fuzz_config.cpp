// Fuzzes the config loader (apps/config/train_config.h) with YAML text. Lines after a line
// "#--set" are taken as --set overrides, one per line, so that config_overrides.cpp is fuzzed
// too. Relative data paths resolve against a temporary folder that holds empty files under the
// names the seeds use (train-images-idx3-ubyte, ..., input.txt): the loader only checks that
// they exist, and with them the sections after data: are read as well.
//
// Expected: a mixprec::Error. A bug: a crash, a sanitizer report, another exception, or a
// loaded config whose to_yaml() does not load back to the same config (the contract of
// to_yaml).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "apps/config/train_config.h"
#include "core/error.h"

namespace {

namespace fs = std::filesystem;

const std::string& base_dir() {
  // Never destroyed: the exit handler below still needs it after static destructors ran.
  static const std::string* const dir = [] {
    const fs::path path =
        fs::temp_directory_path() / ("mixprec_fuzz_config_" + std::to_string(::getpid()));
    fs::create_directories(path);
    for (const char* name : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", "input.txt"}) {
      std::ofstream(path / name).put('\n');
    }
    return new std::string(path.string());
  }();
  return *dir;
}

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_config: %s\n%s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  base_dir();
  std::atexit([] {
    std::error_code ignored;
    fs::remove_all(base_dir(), ignored);
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> overrides;
  const std::string marker = "#--set\n";
  const size_t at = text.find(marker);
  if (at != std::string::npos) {
    size_t begin = at + marker.size();
    while (begin < text.size()) {
      size_t end = text.find('\n', begin);
      if (end == std::string::npos) end = text.size();
      overrides.push_back(text.substr(begin, end - begin));
      begin = end + 1;
    }
    text.resize(at);
  }

  mixprec::TrainConfig config;
  try {
    config = mixprec::parse_train_config(text, "fuzz.yaml", base_dir(), overrides);
  } catch (const mixprec::Error&) {
    return 0;
  }
  const std::string yaml = mixprec::to_yaml(config);
  std::string again;
  try {
    again = mixprec::to_yaml(mixprec::parse_train_config(yaml, "written.yaml", base_dir()));
  } catch (const mixprec::Error& e) {
    fail("to_yaml wrote a config that does not load", std::string(e.what()) + "\n" + yaml);
  }
  if (again != yaml) fail("to_yaml does not read back to the same config", yaml + "---\n" + again);
  return 0;
}
