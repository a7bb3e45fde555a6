// Bad input to `mixprec train` and `mixprec eval`: exit code 2, one message naming the file
// and the problem, no stack trace, and nothing written into the run folder.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>

#include "apps/checkpoint/safetensors.h"
#include "apps/train/trainer.h"
#include "core/error.h"
#include "train_test_support.h"

extern char** environ;

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

namespace {

// Every file under `dir` by relative path with its bytes, and every folder (as "<folder>"):
// equal snapshots mean nothing was added, removed or changed.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    const std::string name = fs::relative(entry.path(), dir).string();
    files[name] = entry.is_directory() ? "<folder>" : read_text(entry.path().string());
  }
  return files;
}

// The `mixprec` program of this build (mixprec_binary()), or an empty path when it is not
// built.
fs::path built_mixprec_binary() {
  const fs::path binary = mixprec_binary();
  std::error_code error;
  return fs::exists(binary, error) ? binary : fs::path();
}

struct ProcessResult {
  bool exited = false;  // false: ended by a signal
  int code = -1;
  std::string out, err;
};

// Runs `binary` with `args` as its own process, its output in files under `scratch`.
ProcessResult run_process(const fs::path& binary, const std::vector<std::string>& args,
                          const ScratchDir& scratch) {
  const std::string out_path = scratch / "stdout.txt", err_path = scratch / "stderr.txt";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<std::string> all{binary.string()};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  REQUIRE(spawned == 0);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  ProcessResult result;
  result.exited = WIFEXITED(status);
  result.code = result.exited ? WEXITSTATUS(status) : -WTERMSIG(status);
  result.out = read_text(out_path);
  result.err = read_text(err_path);
  return result;
}

// Little-endian 8-byte header length, then `header`, then `data`.
std::string safetensors_bytes(uint64_t header_length, const std::string& header,
                              const std::string& data) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header_length >> (8 * i)) & 0xff);
  return bytes + header + data;
}

struct DamagedCheckpoint {
  const char* what;
  // Damages the files of a step_<N> folder.
  std::function<void(const fs::path& folder)> damage;
  const char* file;                   // the message names this file of that folder
  std::vector<std::string> needles;   // and says this
  bool eval_reads_it;  // eval reads the weights and state.json's step, not the config
};

}  // namespace

TEST_CASE("train --resume and eval: every kind of damaged checkpoint is an error that names the "
          "file and changes nothing", "[apps][train][bad_checkpoint]") {
  const fs::path images = mnist_dir() / "t10k-images-idx3-ubyte.gz";
  const fs::path labels = mnist_dir() / "t10k-labels-idx1-ubyte.gz";
  if (!fs::exists(images)) {
    WARN("MNIST test set not found; skipped");
    return;
  }
  ScratchDir dir("bad-checkpoint");
  // Three runs of 2 steps with a checkpoint after each: the one to damage, one with another
  // seed and one with another model, whose state.json files are written by other configs.
  const std::string config = dir / "config.yaml";
  write_text(config, mnist_config(images.string(), labels.string()));
  const std::string other_model = dir / "other_model.yaml";
  std::string text = mnist_config(images.string(), labels.string());
  text.replace(text.find("{linear: 10}"), 12, "{linear: 12}, relu, {linear: 10}");
  write_text(other_model, text);
  const std::vector<std::string> two_steps{"--set", "train.steps=2", "--set", "checkpoint.every=1",
                                           "--set", "checkpoint.keep=0"};
  const auto train = [&](const std::string& cfg, const std::string& out,
                         std::vector<std::string> extra) {
    std::vector<std::string> args{"train", cfg, "--out", out};
    args.insert(args.end(), two_steps.begin(), two_steps.end());
    args.insert(args.end(), extra.begin(), extra.end());
    const CliResult r = run_cli(args);
    INFO(r.err);
    REQUIRE(r.code == 0);
  };
  const std::string base = dir / "base", seed_run = dir / "seed", model_run = dir / "model";
  train(config, base, {});
  train(config, seed_run, {"--set", "train.seed=7"});
  train(other_model, model_run, {});
  const auto newest_file = [](const std::string& run, const char* file) {
    return run + "/checkpoints/step_2/" + file;
  };
  const std::string good_model = read_text(newest_file(base, "model.safetensors"));
  const std::string good_state = read_text(newest_file(base, "state.json"));
  // The tensors of the model [flatten, linear 10]: 1.weight [10, 784] and 1.bias [10].
  const auto rewrite_model = [](const fs::path& folder,
                                const std::function<void(std::vector<std::pair<std::string, mixprec::Tensor>>&)>& edit) {
    const std::string file = (folder / "model.safetensors").string();
    const auto read = mixprec::read_safetensors(file);
    std::vector<std::pair<std::string, mixprec::Tensor>> tensors(read.tensors.begin(),
                                                                 read.tensors.end());
    edit(tensors);
    mixprec::write_safetensors(file, tensors);
  };

  const std::vector<DamagedCheckpoint> cases{
      {"a header that is not JSON",
       [&](const fs::path& f) {
         write_text((f / "model.safetensors").string(),
                    safetensors_bytes(16, "{\"1.weight\": [[[", std::string(64, '\0')));
       },
       "model.safetensors", {"the header is not valid JSON"}, true},
      {"a header length beyond the file",
       [&](const fs::path& f) {
         write_text((f / "model.safetensors").string(),
                    safetensors_bytes(uint64_t{1} << 40, "{}", std::string(64, '\0')));
       },
       "model.safetensors", {"header length 1099511627776 goes beyond the end of the file"}, true},
      {"a tensor of another shape",
       [&](const fs::path& f) {
         rewrite_model(f, [](auto& tensors) {
           for (auto& [name, tensor] : tensors)
             if (name == "1.bias") tensor = mixprec::Tensor::zeros({11}, mixprec::DType::F32);
         });
       },
       "model.safetensors", {"does not fit this model", "1.bias: expected [10] got [11]"}, true},
      {"a missing tensor",
       [&](const fs::path& f) {
         rewrite_model(f, [](auto& tensors) {
           tensors.erase(std::remove_if(tensors.begin(), tensors.end(),
                                        [](const auto& t) { return t.first == "1.bias"; }),
                         tensors.end());
         });
       },
       "model.safetensors", {"does not fit this model", "missing keys (1)", "1.bias"}, true},
      {"state.json of a run with another seed",
       [&](const fs::path& f) {
         write_text((f / "state.json").string(), read_text(newest_file(seed_run, "state.json")));
       },
       "state.json", {"another config"}, false},
      {"state.json of a run with another model",
       [&](const fs::path& f) {
         write_text((f / "state.json").string(), read_text(newest_file(model_run, "state.json")));
       },
       "state.json", {"another config"}, false},
      {"a truncated state.json",
       [&](const fs::path& f) {
         write_text((f / "state.json").string(), good_state.substr(0, good_state.size() / 2));
       },
       "state.json", {"is not valid JSON"}, true},
  };

  const fs::path binary = built_mixprec_binary();
  if (binary.empty()) WARN("the mixprec program is not built beside this test; its runs skipped");
  int n = 0;
  for (const DamagedCheckpoint& c : cases) {
    INFO(c.what);
    const std::string run = dir / ("case" + std::to_string(n++));
    fs::copy(base, run, fs::copy_options::recursive);
    const fs::path folder = fs::path(run) / "checkpoints" / "step_2";
    c.damage(folder);
    const std::string named = (folder / c.file).string();
    const std::map<std::string, std::string> before = snapshot(run);
    // Sanity: the damage is there, and the older checkpoint is intact.
    CHECK((read_text(newest_file(run, "model.safetensors")) != good_model ||
           read_text(newest_file(run, "state.json")) != good_state));

    const auto check_message = [&](const std::string& message) {
      INFO("message: " << message);
      CHECK(message.find(named) != std::string::npos);
      for (const std::string& needle : c.needles) CHECK(message.find(needle) != std::string::npos);
    };
    // In-process: a mixprec::Error.
    mixprec::TrainOptions resume;
    resume.config_path = config;
    resume.resume_dir = run;
    resume.overrides = {"train.steps=4"};
    std::ostringstream log;
    bool thrown = false;
    try {
      mixprec::run_training(resume, log);
    } catch (const mixprec::Error& e) {
      thrown = true;
      check_message(e.what());
    }
    CHECK(thrown);
    CHECK(snapshot(run) == before);

    thrown = false;
    mixprec::EvalOptions eval;
    eval.config_path = config;
    eval.checkpoint = run;
    try {
      const nlohmann::json result = mixprec::run_evaluation(eval);
      // Only a state.json of another config is read without complaint: eval uses the weights.
      CHECK_FALSE(c.eval_reads_it);
      CHECK(result["step"] == 2);
    } catch (const mixprec::Error& e) {
      thrown = true;
      check_message(e.what());
    }
    CHECK(thrown == c.eval_reads_it);
    CHECK(snapshot(run) == before);

    if (binary.empty()) continue;
    // The program itself: exit code 2, one line, no abort or trace.
    std::vector<std::vector<std::string>> commands{
        {"train", config, "--resume", run, "--set", "train.steps=4"}};
    if (c.eval_reads_it) commands.push_back({"eval", config, "--checkpoint", run});
    ScratchDir outputs("bad-checkpoint-process");
    for (const auto& args : commands) {
      INFO("mixprec " << args[0]);
      const ProcessResult r = run_process(binary, args, outputs);
      INFO("stderr: " << r.err);
      CHECK(r.exited);
      CHECK(r.code == 2);
      CHECK(r.err.rfind("error: ", 0) == 0);
      CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
      CHECK(r.err.find(named) != std::string::npos);
      CHECK(r.err.find("terminate called") == std::string::npos);
      CHECK(r.out.empty());
      CHECK(snapshot(run) == before);
    }
  }
}
