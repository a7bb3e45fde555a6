// Folders for the config tests: a temporary folder with files written into it, and a scoped
// change of the working directory (relative data paths resolve against it); the smallest CNN
// config, with the data files it names, and a config parsed as a file of such a folder.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "apps/config/train_config.h"

namespace config_test {

namespace fs = std::filesystem;

// A fresh folder under the system temp dir, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "mixprec_config_XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }
  std::string file(const std::string& relative) const {
    return (path_ / relative).lexically_normal().string();
  }
  // Writes `text` to `relative` (parents created) and returns the absolute path.
  std::string write(const std::string& relative, const std::string& text = "x") const {
    const fs::path target = path_ / relative;
    fs::create_directories(target.parent_path());
    std::ofstream(target) << text;
    return file(relative);
  }

 private:
  fs::path path_;
};

// Switches the working directory for one test.
class WorkingDir {
 public:
  explicit WorkingDir(const fs::path& dir) : previous_(fs::current_path()) {
    fs::current_path(dir);
  }
  ~WorkingDir() { fs::current_path(previous_); }

 private:
  fs::path previous_;
};

// The four IDX files a CNN config names, under data/ of `dir` (their contents are not read).
inline void write_idx_files(const TempDir& dir) {
  for (const char* name : {"train-images", "train-labels", "test-images", "test-labels"})
    dir.write(std::string("data/") + name);
}

// A CNN config that sets only what has no default: one linear layer on the files
// write_idx_files writes.
inline constexpr const char* kMinimalCnn = R"(model:
  layers: [flatten, {linear: 10}]
data:
  train_images: data/train-images
  train_labels: data/train-labels
  test_images: data/test-images
  test_labels: data/test-labels
)";

// `yaml` with `overrides` as the file test.yaml in `dir`: relative paths resolve against `dir`.
inline mixprec::TrainConfig parse_in(const TempDir& dir, const std::string& yaml,
                                     const std::vector<std::string>& overrides = {}) {
  return mixprec::parse_train_config(yaml, dir.file("test.yaml"), dir.path().string(), overrides);
}

}  // namespace config_test
