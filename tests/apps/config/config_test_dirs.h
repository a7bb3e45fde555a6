// Folders for the config tests: a temporary folder with files written into it, and a scoped
// change of the working directory (relative data paths resolve against it).
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>

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

}  // namespace config_test
