// Bad input to `mixprec train` and `mixprec eval`: exit code 2, one message naming the file
// and the problem, no stack trace, and nothing written into the run folder.
#include <catch2/catch.hpp>

#include "train_test_support.h"

using namespace train_test;

namespace {

// A config for the MNIST test set in ../shared/data (present in every checkout), used as both
// splits; `extra` is appended as more YAML.
std::string mnist_config(const std::string& images, const std::string& labels,
                         const std::string& extra = "") {
  return "model:\n  type: cnn\n  in_channels: 1\n  input_size: 28\n"
         "  layers: [flatten, {linear: 10}]\n"
         "data:\n  train_images: " + images + "\n  train_labels: " + labels +
         "\n  test_images: " + images + "\n  test_labels: " + labels +
         "\n  limit_train: 64\n  limit_test: 32\n"
         "train: {steps: 1, batch_size: 16}\ndevice: cpu\n" + extra;
}

fs::path mnist_dir() { return repo_root().parent_path() / "shared" / "data" / "mnist"; }

struct BadCase {
  const char* what;
  std::string config_text;         // written to config.yaml ("" = no file)
  std::vector<std::string> extra;  // more arguments
  std::vector<const char*> needles;  // the message must contain each
};

}  // namespace

TEST_CASE("train: every kind of bad input exits 2 with one clear message", "[apps][train]") {
  const fs::path images = mnist_dir() / "t10k-images-idx3-ubyte.gz";
  const fs::path labels = mnist_dir() / "t10k-labels-idx1-ubyte.gz";
  if (!fs::exists(images)) {
    WARN("MNIST test set not found at " << images << "; skipped");
    return;
  }
  ScratchDir dir("bad");
  // Files with known defects.
  const std::string not_idx = dir / "not_idx.gz";
  write_text(not_idx, "this is not an IDX file at all");
  const std::string truncated = dir / "truncated.idx";
  {
    const std::string header("\x00\x00\x08\x03\x00\x00\x00\x02\x00\x00\x00\x1c\x00\x00\x00\x1c", 16);
    write_text(truncated, header + std::string(100, '\x01'));  // 2 images need 1568 bytes
  }
  const std::string labels_11 = dir / "labels_11.idx";
  {
    std::string file("\x00\x00\x08\x01\x00\x00\x27\x10", 8);  // 10000 labels
    file += std::string(10000, '\x03');
    file[8 + 5] = 11;  // one label out of range for 10 classes
    write_text(labels_11, file);
  }
  const std::string good = mnist_config(images.string(), labels.string());

  const std::vector<BadCase> cases{
      {"missing config", "", {}, {"not found"}},
      {"malformed YAML", "model: [unclosed\n", {}, {"config.yaml:", "2:"}},
      {"unknown key with a suggestion", good + "optimizer: {lerning_rate: 0.1}\n", {},
       {"optimizer.lerning_rate", "did you mean 'lr'"}},
      {"wrong type", good, {"--set", "train.batch_size=abc"}, {"train.batch_size", "integer"}},
      {"out of range", good, {"--set", "train.batch_size=0"}, {"train.batch_size", ">= 1"}},
      {"unknown precision", good, {"--set", "precision=fp8"}, {"precision", "fp16"}},
      {"missing data file", mnist_config("nowhere/images.gz", labels.string()), {},
       {"train_images", "nowhere/images.gz"}},
      {"wrong magic", mnist_config(not_idx, labels.string()), {}, {not_idx.c_str(), "magic"}},
      {"truncated data", mnist_config(truncated, labels.string()), {},
       {truncated.c_str(), "truncated"}},
      {"label out of range", mnist_config(images.string(), labels_11), {},
       {labels_11.c_str(), "out of range"}},
      {"unknown tensor to inject", good, {"--set", "debug.inject_nonfinite={step: 1, tensor: x}"},
       {"no parameter named 'x'", "1.weight"}},
      {"cuda without a device", good, {"--set", "device=cuda"}, {"device"}},
      {"a model for other images", good, {"--set", "model.input_size=32"},
       {"does not fit the data"}},
      {"fewer outputs than classes", good, {"--set", "model.layers=[flatten, {linear: 5}]"},
       {"does not fit the data"}},
      {"injection after the last step", good,
       {"--set", "debug.inject_nonfinite={step: 5, tensor: 1.weight}"}, {"only 1 steps"}},
      {"an absurd size", good, {"--set", "train.batch_size=1152921504606846976"},
       {"train.batch_size", "<="}},
  };
  for (const BadCase& c : cases) {
#if MIXPREC_WITH_CUDA
    if (std::string(c.what) == "cuda without a device") continue;  // a GPU may be present
#endif
    INFO(c.what);
    const std::string config = dir / "config.yaml";
    fs::remove(config);
    if (!c.config_text.empty()) write_text(config, c.config_text);
    const std::string run = dir / "run";
    std::vector<std::string> args{"train", config, "--out", run};
    args.insert(args.end(), c.extra.begin(), c.extra.end());
    const CliResult r = run_cli(args);
    INFO("stderr: " << r.err);
    CHECK(r.code == 2);
    CHECK(r.err.rfind("error: ", 0) == 0);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);  // one line
    for (const char* needle : c.needles) CHECK(r.err.find(needle) != std::string::npos);
    CHECK_FALSE(fs::exists(run));  // nothing written
  }
}

TEST_CASE("train: bad text data and a run folder that is a file exit 2", "[apps][train]") {
  ScratchDir dir("bad-text");
  const auto gpt_config = [&](const std::string& text_path) {
    return "model: {type: gpt, block_size: 8, n_layer: 1, n_head: 1, n_embd: 8}\n"
           "data: {kind: text, path: " + text_path + "}\n"
           "train: {steps: 1, batch_size: 2}\ndevice: cpu\n";
  };
  const std::string empty = dir / "empty.txt", invalid = dir / "invalid.txt",
                    short_text = dir / "short.txt", good_text = dir / "good.txt";
  write_text(empty, "");
  write_text(invalid, "abc\xff\xfe def");
  write_text(short_text, "abcdefghij");  // 9 train + 1 validation characters, windows of 9
  std::string long_text;
  for (int i = 0; i < 200; ++i) long_text += "to be or not to be ";
  write_text(good_text, long_text);
  const std::vector<std::pair<std::string, std::vector<const char*>>> cases{
      {empty, {"empty"}},
      {invalid, {"UTF-8", "offset 3"}},
      {short_text, {"block_size"}},
  };
  for (const auto& [path, needles] : cases) {
    INFO(path);
    const std::string config = dir / "gpt.yaml";
    write_text(config, gpt_config(path));
    const CliResult r = run_cli({"train", config, "--out", dir / "run"});
    INFO("stderr: " << r.err);
    CHECK(r.code == 2);
    CHECK(r.err.find(path) != std::string::npos);
    for (const char* needle : needles) CHECK(r.err.find(needle) != std::string::npos);
    CHECK_FALSE(fs::exists(dir / "run"));
  }
  // A file where the run folder should go.
  const std::string config = dir / "gpt.yaml";
  write_text(config, gpt_config(good_text));
  const std::string a_file = dir / "a_file";
  write_text(a_file, "x");
  const CliResult r = run_cli({"train", config, "--out", a_file + "/run"});
  INFO("stderr: " << r.err);
  CHECK(r.code == 2);
  CHECK(r.err.find(a_file) != std::string::npos);
  CHECK(read_text(a_file) == "x");
}

TEST_CASE("eval: a damaged checkpoint exits 2 naming the file", "[apps][train]") {
  const fs::path images = mnist_dir() / "t10k-images-idx3-ubyte.gz";
  const fs::path labels = mnist_dir() / "t10k-labels-idx1-ubyte.gz";
  if (!fs::exists(images)) {
    WARN("MNIST test set not found; skipped");
    return;
  }
  ScratchDir dir("bad-eval");
  const std::string config = dir / "config.yaml";
  write_text(config, mnist_config(images.string(), labels.string()));
  const std::string run = dir / "run";
  const CliResult trained = run_cli({"train", config, "--out", run});
  INFO(trained.err);
  REQUIRE(trained.code == 0);
  const std::string model = run + "/checkpoints/step_1/model.safetensors";

  const CliResult ok = run_cli({"eval", config, "--checkpoint", run});
  CHECK(ok.code == 0);

  // Another model shape: the checkpoint does not fit.
  const std::string other = dir / "other.yaml";
  std::string text = mnist_config(images.string(), labels.string());
  text.replace(text.find("{linear: 10}"), 12, "{linear: 12}, relu, {linear: 10}");
  write_text(other, text);
  const CliResult misfit = run_cli({"eval", other, "--checkpoint", run});
  CHECK(misfit.code == 2);
  CHECK(misfit.err.find("does not fit") != std::string::npos);

  // A header that claims more than the file holds.
  std::string bytes = read_text(model);
  write_text(model, bytes.substr(0, bytes.size() / 2));
  const CliResult cut = run_cli({"eval", config, "--checkpoint", run});
  CHECK(cut.code == 2);
  CHECK(cut.err.find("model.safetensors") != std::string::npos);

  // No checkpoint at all.
  const CliResult none = run_cli({"eval", config, "--checkpoint", dir / "nothing"});
  CHECK(none.code == 2);
  CHECK(none.err.find("no checkpoint") != std::string::npos);
}
