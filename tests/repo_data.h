// Where the tests find the repository and its data, and the small training runs several test
// files train: one copy for tests/apps, tests/apps/data and tests/cuda.
//
// Contract:
// - repo_root(): the CUDA tests also run on a lent GPU machine, from a copy of the repository
//   whose path differs from the one this file was compiled at, so the root is looked up:
//   $MIXPREC_SOURCE_DIR (scripts/gpu_check.sh sets it), then the compile-time path, then the
//   working directory; the first that holds configs/ wins, else the path is empty.
// - find_data(relative): the first of $MIXPREC_DATA_DIR, <root>/shared/data,
//   <root>/../shared/data and <root>/data (the copies shipped in the repository,
//   data/README.md) that holds `relative`; an empty path when none does.
// - Nothing here fails a test: a caller that needs a file checks for the empty path and skips
//   with a warning.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace mixprec_test {

inline bool holds_configs(const std::filesystem::path& root) {
  std::error_code ignored;
  return !root.empty() && std::filesystem::exists(root / "configs" / "gpt_shakespeare.yaml", ignored);
}

// The repository root, or an empty path when none of the candidates holds configs/.
inline std::filesystem::path repo_root() {
  std::vector<std::filesystem::path> candidates;
  if (const char* env = std::getenv("MIXPREC_SOURCE_DIR"); env != nullptr && *env != '\0') {
    candidates.emplace_back(env);
  }
  // tests/<this file> -> the repository root.
  candidates.push_back(std::filesystem::path(__FILE__).parent_path().parent_path());
  std::error_code ignored;
  candidates.push_back(std::filesystem::current_path(ignored));
  for (const std::filesystem::path& root : candidates) {
    if (holds_configs(root)) return root;
  }
  return {};
}

// configs/`name` of the repository.
inline std::string config_path(const char* name) { return (repo_root() / "configs" / name).string(); }

// The data folders find_data searches, in its order.
inline std::vector<std::filesystem::path> data_folders() {
  std::vector<std::filesystem::path> folders;
  if (const char* env = std::getenv("MIXPREC_DATA_DIR"); env != nullptr && *env != '\0') {
    folders.emplace_back(env);
  }
  const std::filesystem::path root = repo_root();
  if (!root.empty()) {
    folders.push_back(root / "shared" / "data");
    folders.push_back(root.parent_path() / "shared" / "data");
    folders.push_back(root / "data");
  }
  return folders;
}

// `relative` (e.g. "tinyshakespeare/input.txt") in the first data folder that has it; an
// empty path when none does.
inline std::filesystem::path find_data(const std::string& relative) {
  std::error_code ignored;
  for (const std::filesystem::path& folder : data_folders()) {
    if (std::filesystem::exists(folder / relative, ignored)) return (folder / relative).lexically_normal();
  }
  return {};
}

// The corpus of the GPT configs as the repository ships it (data/README.md), the file their
// relative data.path names.
inline std::filesystem::path shakespeare_path() {
  return repo_root() / "data" / "tinyshakespeare" / "input.txt";
}

// The folder of the MNIST test set (t10k images and labels), or an empty path.
inline std::filesystem::path mnist_dir() {
  const std::filesystem::path images = find_data("mnist/t10k-images-idx3-ubyte.gz");
  return images.empty() ? images : images.parent_path();
}
inline bool mnist_present() {
  const std::filesystem::path dir = mnist_dir();
  std::error_code ignored;
  return !dir.empty() && std::filesystem::exists(dir / "t10k-labels-idx1-ubyte.gz", ignored);
}

// Where the Debian package dataset-fashion-mnist installs Fashion-MNIST.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

inline bool fashion_mnist_installed() {
  const std::filesystem::path dir = kFashionMnistDir;
  std::error_code ignored;
  for (const char* file : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                           "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) {
    if (!std::filesystem::exists(dir / file, ignored)) return false;
  }
  return true;
}

// ---- small training runs ----------------------------------------------------------------------

// Overrides of gpt_shakespeare.yaml for a GPT small enough for a test run (one layer, two
// heads, 32 wide, windows of 16 tokens, batches of 4, 2 evaluation batches) on `text`.
inline std::vector<std::string> small_gpt_overrides(const std::filesystem::path& text) {
  return {"data.path=" + text.string(), "model.n_layer=1",     "model.n_head=2",
          "model.n_embd=32",            "model.block_size=16", "train.batch_size=4",
          "data.eval_batches=2"};
}

// `overrides` as `--set` arguments of `mixprec train`.
inline std::vector<std::string> as_set_args(const std::vector<std::string>& overrides) {
  std::vector<std::string> args;
  for (const std::string& o : overrides) {
    args.push_back("--set");
    args.push_back(o);
  }
  return args;
}

// The model and data sections of a config for a small CNN with batch norm (a 4-channel 3x3
// convolution, 2x2 max pooling, a linear layer) on the MNIST test set as both splits, 256
// training and 32 test images: steps take milliseconds. Empty when the MNIST test set is not
// here.
inline std::string small_mnist_cnn_yaml() {
  if (!mnist_present()) return {};
  const std::string images = (mnist_dir() / "t10k-images-idx3-ubyte.gz").string();
  const std::string labels = (mnist_dir() / "t10k-labels-idx1-ubyte.gz").string();
  return "model:\n  type: cnn\n  in_channels: 1\n  input_size: 28\n"
         "  layers: [{conv: 4, kernel: 3}, batchnorm, relu, {maxpool: 2}, flatten, {linear: 10}]\n"
         "data:\n  train_images: " + images + "\n  train_labels: " + labels +
         "\n  test_images: " + images + "\n  test_labels: " + labels +
         "\n  limit_train: 256\n  limit_test: 32\n";
}

}  // namespace mixprec_test
