// The training-config loader on bad input: each class of error and what its message says
// (origin, key path, suggestion, allowed values, the value found).
#include <stdlib.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "apps/config/train_config.h"
#include "core/error.h"
#include "tests/apps/config/config_test_dirs.h"
#include "tests/error_message.h"

namespace fs = std::filesystem;
using Catch::Contains;
using Catch::StartsWith;
using mixprec_test::error_message;

namespace {

// A temporary folder holding every data file the test configs name.
class ErrorTempDir : public config_test::TempDir {
 public:
  ErrorTempDir() {
    for (const char* name :
         {"train-images", "train-labels", "test-images", "test-labels", "input.txt"})
      write(name, "x");
  }
};

using config_test::WorkingDir;

const char* kCnn = R"(model:
  type: cnn
  layers: [{conv: 8}, relu, flatten, {dropout: 0.5}, {linear: 10}]
data:
  train_images: train-images
  train_labels: train-labels
  test_images: test-images
  test_labels: test-labels
train:
  epochs: 3
)";

const char* kGpt = R"(model: {type: gpt, n_head: 4, n_embd: 96}
data: {path: input.txt}
train: {steps: 100}
)";

const std::string kOrigin = "cfg/run.yaml";

std::string parse_error(const ErrorTempDir& dir, const std::string& yaml,
                        const std::vector<std::string>& overrides = {}) {
  const std::string message = error_message(
      [&] { mixprec::parse_train_config(yaml, kOrigin, dir.path().string(), overrides); });
  CHECK_THAT(message, StartsWith(kOrigin + ":"));
  return message;
}

// The 1-based number of the line that `needle` starts in `text`.
size_t line_of(const std::string& text, const std::string& needle) {
  const size_t at = text.find(needle);
  REQUIRE(at != std::string::npos);
  return static_cast<size_t>(std::count(text.begin(), text.begin() + at, '\n')) + 1;
}

struct Case {
  std::string override_;  // applied to the base config
  std::string expected;   // a part of the message
};

void check_cases(const ErrorTempDir& dir, const std::string& base, const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    INFO("--set " << c.override_);
    const std::string message = parse_error(dir, base, {c.override_});
    CHECK_THAT(message, Contains(c.expected));
    CHECK_THAT(message, Contains("(from --set " + c.override_ + ")"));
  }
}

}  // namespace

TEST_CASE("config errors: the base configs of these tests are valid", "[config]") {
  ErrorTempDir dir;
  CHECK_NOTHROW(mixprec::parse_train_config(kCnn, kOrigin, dir.path().string()));
  CHECK_NOTHROW(mixprec::parse_train_config(kGpt, kOrigin, dir.path().string()));
}

TEST_CASE("config errors: unknown keys name their path and suggest a near key", "[config]") {
  ErrorTempDir dir;
  {
    const std::string yaml = std::string(kCnn) + "optimzer: {lr: 0.1}\n";
    const std::string message = parse_error(dir, yaml);
    CHECK(message == kOrigin + ": unknown key 'optimzer' (did you mean 'optimizer'?) (line " +
                         std::to_string(line_of(yaml, "optimzer")) + ")");
  }
  {
    // A synonym within distance 2 points at the real key.
    const std::string yaml = std::string(kCnn) + "optimizer:\n  lr: 0.1\n  lerning_rate: 0.1\n";
    CHECK_THAT(parse_error(dir, yaml),
               StartsWith(kOrigin + ": unknown key 'optimizer.lerning_rate' (did you mean 'lr'?)"));
  }
  {
    const std::string message =
        parse_error(dir, std::string(kCnn) + "schedule: {warmup_step: 5}\n");
    CHECK_THAT(message,
               Contains("unknown key 'schedule.warmup_step' (did you mean 'warmup_steps'?)"));
  }
  {
    // Nothing within distance 2: no suggestion, the valid keys instead.
    const std::string message = parse_error(dir, std::string(kCnn) + "checkpoint: {zzzzzz: 1}\n");
    CHECK_THAT(message, Contains("unknown key 'checkpoint.zzzzzz'"));
    CHECK_THAT(message, !Contains("did you mean"));
    CHECK_THAT(message, Contains("every, keep, save_initial"));
  }
  {
    // Deeper: debug.inject_nonfinite.
    const std::string message = parse_error(
        dir, std::string(kCnn) + "debug: {inject_nonfinite: {step: 1, tensr: 0.weight}}\n");
    CHECK_THAT(message,
               Contains("unknown key 'debug.inject_nonfinite.tensr' (did you mean 'tensor'?)"));
  }
  {
    // A GPT setting under a CNN model says where it belongs.
    const std::string message = parse_error(dir, kCnn, {"model.n_head=4"});
    CHECK_THAT(message,
               Contains("unknown key 'model.n_head' (it is a setting of type gpt, not cnn)"));
  }
  {
    const std::string message = parse_error(dir, kGpt, {"model.layers=[relu]"});
    CHECK_THAT(message,
               Contains("unknown key 'model.layers' (it is a setting of type cnn, not gpt)"));
  }
  {
    const std::string message = parse_error(dir, kCnn, {"data.val_fraction=0.2"});
    CHECK_THAT(message, Contains("unknown key 'data.val_fraction' (it is a setting of kind text"));
  }
  {
    const std::string message = parse_error(dir, std::string(kCnn) + "train: {batch_size: 8}\n");
    CHECK_THAT(message, Contains("duplicate key 'train'"));
  }
}

TEST_CASE("config errors: unknown layers and layer options", "[config]") {
  ErrorTempDir dir;
  CHECK_THAT(parse_error(dir, kCnn, {"model.layers[1]=rellu"}),
             Contains("model.layers[1]: unknown layer 'rellu' (did you mean 'relu'?)"));
  CHECK_THAT(parse_error(dir, kCnn, {"model.layers[2]={flaten: ~}"}),
             Contains("model.layers[2]: unknown layer 'flaten' (did you mean 'flatten'?)"));
  {
    const std::string message = parse_error(dir, kCnn, {"model.layers[0]=lstm"});
    CHECK_THAT(message, Contains("model.layers[0]: unknown layer 'lstm'; the layers are conv, "
                                 "batchnorm, relu, gelu, maxpool, avgpool, flatten, linear, "
                                 "dropout"));
  }
  CHECK_THAT(parse_error(dir, kCnn, {"model.layers[0]={conv: 8, kernal: 3}"}),
             Contains("unknown key 'model.layers[0].kernal' (did you mean 'kernel'?)"));
  CHECK_THAT(parse_error(dir, kCnn, {"model.layers[4]={linear: 10, bais: false}"}),
             Contains("unknown key 'model.layers[4].bais' (did you mean 'bias'?)"));
  CHECK_THAT(parse_error(dir, kCnn, {"model.layers[0]={maxpool: 2, kernel: 3}"}),
             Contains("unknown key 'model.layers[0].kernel'"));
  CHECK_THAT(parse_error(dir, kCnn, {"model.layers[0]={conv: 8, relu: ~}"}),
             Contains("unknown key 'model.layers[0].relu' (it is a layer of its own"));
  CHECK_THAT(parse_error(dir, kCnn, {"model.layers[0]={kernel: 3, conv: 8}"}),
             Contains("model.layers[0]: the first key of a layer names its kind, but 'kernel' "
                      "comes before 'conv'"));
  CHECK_THAT(parse_error(dir, kCnn, {"model.layers[0]=conv"}),
             Contains("model.layers[0]: layer 'conv' needs a value"));
  CHECK_THAT(parse_error(dir, kCnn, {"model.layers[1]={relu: 1}"}),
             Contains("model.layers[1]: layer 'relu' takes no value or options"));
  CHECK_THAT(parse_error(dir, kCnn, {"model.layers[1]=[relu]"}),
             Contains("model.layers[1]: expected a layer name such as relu or a map"));
  CHECK_THAT(parse_error(dir, kCnn, {"model.layers=[]"}),
             Contains("model.layers must not be empty"));
  CHECK_THAT(parse_error(dir, kCnn, {"model.layers=relu"}),
             Contains("model.layers: expected a list of layers, got 'relu'"));
}

TEST_CASE("config errors: wrong types name the key, the type and the value", "[config]") {
  ErrorTempDir dir;
  {
    const std::string yaml = std::string(kCnn) + "  batch_size: abc\n";
    CHECK(parse_error(dir, yaml) == kOrigin +
                                        ": train.batch_size: expected an integer, got "
                                        "'abc' (line " +
                                        std::to_string(line_of(yaml, "  batch_size")) + ")");
  }
  check_cases(
      dir, kCnn,
      {{"train.batch_size=12.5", "train.batch_size: expected an integer, got '12.5'"},
       {"train.batch_size=1e3", "train.batch_size: expected an integer, got '1e3'"},
       {"train.batch_size=128.0", "train.batch_size: expected an integer, got '128.0'"},
       {"train.batch_size=\"128\"",
        "train.batch_size: expected an integer, got the quoted string '128'"},
       {"train.batch_size=[128]", "train.batch_size: expected an integer, got a list"},
       {"train.batch_size=", "train.batch_size: expected an integer, got null"},
       {"train.steps=99999999999999999999",
        "train.steps: 99999999999999999999 does not fit a 64-bit integer"},
       {"train.seed=-1", "train.seed must be >= 0, got -1"},
       {"train.seed=1.5", "train.seed: expected an integer, got '1.5'"},
       {"optimizer=[1, 2]", "optimizer: expected a map, got a list"},
       {"optimizer=sgd", "optimizer: expected a map, got 'sgd'"},
       {"optimizer.lr=fast", "optimizer.lr: expected a number, got 'fast'"},
       {"optimizer.lr=1e999", "optimizer.lr: expected a number, got '1e999'"},
       {"optimizer.lr='0.1'", "optimizer.lr: expected a number, got the quoted string '0.1'"},
       {"optimizer.nesterov=yes", "optimizer.nesterov: expected true or false, got 'yes'"},
       {"optimizer.nesterov=1", "optimizer.nesterov: expected true or false, got '1'"},
       {"optimizer.nesterov=on", "optimizer.nesterov: expected true or false, got 'on'"},
       {"optimizer.nesterov=\"true\"",
        "optimizer.nesterov: expected true or false, got the quoted string 'true'"},
       {"data.shuffle=0", "data.shuffle: expected true or false, got '0'"},
       {"train.cuda_graph=yes", "train.cuda_graph: expected true or false, got 'yes'"},
       {"optimizer.betas=0.9", "optimizer.betas: expected a list of two numbers"},
       {"optimizer.betas=[0.9]", "optimizer.betas: expected a list of two numbers"},
       {"optimizer.betas=[0.9, x]", "optimizer.betas[1]: expected a number, got 'x'"},
       {"precision=[fp16]", "precision: expected one of fp32, fp16, bf16, got a list"},
       {"name={a: 1}", "name: expected a string, got a map"},
       {"data.normalize=0.5", "data.normalize: expected a map, got '0.5'"},
       {"model.layers[0].conv=8.5", "model.layers[0].conv: expected an integer, got '8.5'"},
       {"model.layers[3].dropout=half", "model.layers[3].dropout: expected a number, got 'half'"}});
  CHECK_THAT(
      parse_error(dir, "[1, 2]\n"),
      Contains("expected a map of sections (model:, data:, ...) at the top level, got a list"));
}

TEST_CASE("config errors: out-of-range values name the range and the value", "[config]") {
  ErrorTempDir dir;
  {
    const std::string yaml = std::string(kCnn) + "  batch_size: 0\n";
    CHECK(parse_error(dir, yaml) == kOrigin + ": train.batch_size must be >= 1, got 0 (line " +
                                        std::to_string(line_of(yaml, "  batch_size")) + ")");
  }
  check_cases(
      dir, kCnn,
      {{"train.batch_size=-3", "train.batch_size must be >= 1, got -3"},
       {"train.accumulation_steps=0", "train.accumulation_steps must be >= 1, got 0"},
       {"train.clip_grad_norm=-1", "train.clip_grad_norm must be >= 0, got -1"},
       {"train.eval_every=-1", "train.eval_every must be >= 0, got -1"},
       {"train.log_every=0", "train.log_every must be >= 1, got 0"},
       {"optimizer.lr=-0.1", "optimizer.lr must be >= 0, got -0.1"},
       {"optimizer.lr=.inf", "optimizer.lr must be finite, got .inf"},
       {"optimizer.lr=.nan", "optimizer.lr must be finite, got .nan"},
       {"optimizer.momentum=-0.5", "optimizer.momentum must be >= 0, got -0.5"},
       {"optimizer.weight_decay=-1e-4", "optimizer.weight_decay must be >= 0, got -1e-4"},
       {"optimizer.betas=[0.9, 1.0]", "optimizer.betas[1] must be >= 0 and < 1, got 1.0"},
       {"optimizer.betas=[-0.1, 0.9]", "optimizer.betas[0] must be >= 0 and < 1, got -0.1"},
       {"optimizer.eps=0", "optimizer.eps must be > 0, got 0"},
       {"loss_scale.init_scale=0", "loss_scale.init_scale must be > 0, got 0"},
       {"loss_scale.growth_factor=1", "loss_scale.growth_factor must be > 1, got 1"},
       {"loss_scale.backoff_factor=1", "loss_scale.backoff_factor must be > 0 and < 1, got 1"},
       {"loss_scale.backoff_factor=0", "loss_scale.backoff_factor must be > 0 and < 1, got 0"},
       {"loss_scale.growth_interval=0", "loss_scale.growth_interval must be >= 1, got 0"},
       {"loss_scale.hysteresis=0", "loss_scale.hysteresis must be >= 1, got 0"},
       {"loss_scale.min_scale=0", "loss_scale.min_scale must be > 0, got 0"},
       {"loss_scale.min_scale=-2", "loss_scale.min_scale must be > 0, got -2"},
       {"loss_scale.max_scale=0.5",
        "loss_scale.max_scale (0.5) must be >= loss_scale.min_scale (1.0)"},
       {"loss_scale={policy: dynamic, init_scale: 1.0e9}",
        "loss_scale.init_scale (1.0e+09) must lie within [min_scale, max_scale] = [1.0, "
        "16777216.0]"},
       {"schedule.step_size=0", "schedule.step_size must be >= 1, got 0"},
       {"schedule.gamma=0", "schedule.gamma must be > 0 and <= 1, got 0"},
       {"schedule.gamma=1.5", "schedule.gamma must be > 0 and <= 1, got 1.5"},
       {"schedule.warmup_steps=-1", "schedule.warmup_steps must be >= 0, got -1"},
       {"schedule.min_lr=-1", "schedule.min_lr must be >= 0, got -1"},
       {"schedule={type: cosine, min_lr: 0.5}",
        "schedule.min_lr (0.5) must be <= optimizer.lr (0.01)"},
       {"schedule={type: cosine, warmup_steps: 100, decay_steps: 50}",
        "schedule.decay_steps (50) must be 0 (the whole run) or >= schedule.warmup_steps (100)"},
       {"checkpoint.keep=-1", "checkpoint.keep must be >= 0, got -1"},
       {"checkpoint.every=-5", "checkpoint.every must be >= 0, got -5"},
       {"data.num_classes=1", "data.num_classes must be >= 2, got 1"},
       {"data.limit_train=-1", "data.limit_train must be >= 0, got -1"},
       {"data.normalize={mean: 0.5, std: 0}", "data.normalize.std must be > 0, got 0"},
       {"data.normalize={mean: 0.5}", "data.normalize.std is missing"},
       {"model.in_channels=0", "model.in_channels must be >= 1, got 0"},
       {"model.layers[0]={conv: 0}", "model.layers[0].conv must be >= 1, got 0"},
       {"model.layers[0]={conv: 8, stride: 0}", "model.layers[0].stride must be >= 1, got 0"},
       {"model.layers[0]={conv: 8, padding: -1}", "model.layers[0].padding must be >= 0, got -1"},
       {"model.layers[0]={maxpool: 2, padding: 2}",
        "model.layers[0].padding must be <= kernel / 2 = 1, got 2"},
       {"model.layers[3].dropout=1.0", "model.layers[3].dropout must be >= 0 and < 1, got 1.0"},
       {"model.layers[3].dropout=-0.1", "model.layers[3].dropout must be >= 0 and < 1, got -0.1"},
       {"debug.inject_nonfinite={step: -2, tensor: w}",
        "debug.inject_nonfinite.step must be >= 1, got -2"},
       {"train.batch_size=2000000", "train.batch_size must be <= 1048576, got 2000000"},
       {"loss_scale.growth_interval=4294967297",
        "loss_scale.growth_interval must be <= 2147483647, got 4294967297"},
       {"debug.inject_nonfinite={step: 2}", "debug.inject_nonfinite.tensor is missing"},
       {"optimizer={type: sgd, nesterov: true}",
        "optimizer.nesterov: Nesterov momentum needs optimizer.momentum > 0, got 0.0"}});

  // Exactly one of epochs / steps. In the file both is an error; an override of one replaces
  // the other (`--set train.steps=100` on a config that says epochs), unless both are set.
  CHECK_THAT(parse_error(dir, std::string(kCnn) + "  steps: 100\n"),
             Contains("exactly one of train.epochs and train.steps must be > 0, got "
                      "epochs 3 and steps 100"));
  const mixprec::TrainConfig by_steps =
      mixprec::parse_train_config(kCnn, kOrigin, dir.path().string(), {"train.steps=100"});
  CHECK(by_steps.train.steps == 100);
  CHECK(by_steps.train.epochs == 0);
  CHECK_THAT(parse_error(dir, kCnn, {"train.steps=100", "train.epochs=2"}),
             Contains("got epochs 2 and steps 100"));
  check_cases(dir, kCnn,
              {{"train.epochs=0",
                "exactly one of train.epochs and train.steps must be > 0, got "
                "epochs 0 and steps 0"}});

  // n_embd % n_head: the message points at n_embd, whichever of the two was set.
  CHECK_THAT(parse_error(dir, kGpt, {"model.n_head=5"}),
             Contains("model.n_embd (96) must be divisible by model.n_head (5) (line 1)"));
  check_cases(dir, kGpt,
              {{"model.n_embd=98", "model.n_embd (98) must be divisible by model.n_head (4)"},
               {"model.dropout=1", "model.dropout must be >= 0 and < 1, got 1"},
               {"model.block_size=0", "model.block_size must be >= 1, got 0"},
               {"model.vocab_size=-1", "model.vocab_size must be >= 0, got -1"},
               {"data.val_fraction=1", "data.val_fraction must be > 0 and < 1, got 1"},
               {"data.val_fraction=0", "data.val_fraction must be > 0 and < 1, got 0"},
               {"data.eval_batches=0", "data.eval_batches must be >= 1, got 0"}});
}

TEST_CASE("config errors: choices list the allowed values", "[config]") {
  ErrorTempDir dir;
  check_cases(
      dir, kCnn,
      {{"precision=fp8", "precision must be one of fp32, fp16, bf16, got 'fp8'"},
       {"precision=fp-16",
        "precision must be one of fp32, fp16, bf16, got 'fp-16' (did you "
        "mean 'fp16'?)"},
       {"loss_scale.policy=dynamc",
        "loss_scale.policy must be one of auto, dynamic, static, "
        "none, got 'dynamc' (did you mean 'dynamic'?)"},
       {"loss_scale.floor_policy=ignore",
        "loss_scale.floor_policy must be one of clamp, warn, error, got 'ignore'"},
       {"tf32=sometimes", "tf32: expected true or false"},
       {"loss_scale.hysteresis_mode=always",
        "loss_scale.hysteresis_mode must be one of reset_on_growth, consecutive, got 'always'"},
       {"optimizer.type=lamb", "optimizer.type must be one of sgd, adam, adamw, got 'lamb'"},
       {"schedule.type=linear",
        "schedule.type must be one of constant, step, cosine, got 'linear'"},
       {"device=tpu", "device must be one of cpu, cuda, auto, got 'tpu'"},
       {"model.type=rnn", "model.type must be one of cnn, gpt, got 'rnn'"},
       {"data.kind=csv", "data.kind must be one of idx, text, got 'csv'"},
       {"debug.inject_nonfinite={step: 1, tensor: w, value: zero}",
        "debug.inject_nonfinite.value must be one of inf, nan, got 'zero'"}});
}

TEST_CASE("config errors: train.cuda_graph with a setting it cannot take names both", "[config]") {
  ErrorTempDir dir;
  // Each alone is valid.
  CHECK_NOTHROW(mixprec::parse_train_config(kGpt, kOrigin, dir.path().string(),
                                            {"train.cuda_graph=true", "device=cuda"}));
  CHECK_NOTHROW(mixprec::parse_train_config(kGpt, kOrigin, dir.path().string(),
                                            {"train.host_reads=per_step", "device=cpu",
                                             "debug.detect_anomaly=true"}));
  const struct {
    std::string other;
    std::string expected;
  } cases[] = {
      {"train.host_reads=per_step", "which train.host_reads: per_step makes one step long"},
      {"device=cpu", "device: cpu has none"},
      {"debug.detect_anomaly=true", "debug.detect_anomaly reads every step's tensors"},
  };
  for (const auto& c : cases) {
    INFO(c.other);
    // device=cuda first, so that only c.other stands in the way (a later override wins).
    const std::string message =
        parse_error(dir, kGpt, {"device=cuda", c.other, "train.cuda_graph=true"});
    CHECK_THAT(message, Contains("train.cuda_graph records the deferred step on a GPU"));
    CHECK_THAT(message, Contains(c.expected));
    // In the file instead of an override: the same refusal.
    std::string in_file = kGpt;
    in_file.replace(in_file.find("train: {steps: 100}"), 19, "train: {steps: 100, cuda_graph: true}");
    CHECK_THAT(parse_error(dir, in_file, {"device=cuda", c.other}), Contains(c.expected));
  }
}

TEST_CASE("config errors: required sections and data keys", "[config]") {
  ErrorTempDir dir;
  CHECK_THAT(parse_error(dir, "data: {path: input.txt}\n"),
             Contains("the model section is missing"));
  CHECK_THAT(parse_error(dir, "model: {type: gpt}\n"), Contains("the data section is missing"));
  CHECK_THAT(parse_error(dir, ""), Contains("the model section is missing"));
  CHECK_THAT(parse_error(dir, "model: {type: cnn}\ndata: {path: input.txt}\n"),
             Contains("model.layers is missing"));
  CHECK_THAT(parse_error(dir, "model: {type: gpt}\ndata: {shuffle: true}\n"),
             Contains("data names no data"));
  CHECK_THAT(parse_error(dir, "model: {type: gpt}\ndata: {train_images: train-images}\n"),
             Contains("data.train_labels is missing (required for kind idx)"));
  CHECK_THAT(parse_error(dir, "model: {type: gpt}\ndata: {kind: text}\n"),
             Contains("data.path is missing (required for kind text)"));
  CHECK_THAT(parse_error(dir, kCnn, {"name=''"}), Contains("name must not be empty"));
}

TEST_CASE("config errors: malformed YAML gives path:line:column", "[config]") {
  ErrorTempDir dir;
  // Line 3, and the second ':' of "foo: bar: baz" is its 9th character.
  const std::string path = dir.write("broken.yaml", "name: x\nmodel: {}\nfoo: bar: baz\n");
  const std::string message = error_message([&] { mixprec::load_train_config(path); });
  CHECK_THAT(message, StartsWith(path + ":3:9: "));
  CHECK_THAT(message, Contains("illegal map value"));

  // The stray ']' is the 10th character of line 2.
  CHECK(parse_error(dir, "x: 1\ny: [1, 2]]\n") == kOrigin + ":2:10: illegal flow end");
}

TEST_CASE("config errors: a missing config file", "[config]") {
  ErrorTempDir dir;
  const std::string path = (dir.path() / "nope.yaml").string();
  CHECK(error_message([&] { mixprec::load_train_config(path); }) ==
        "config file '" + path + "' not found");
  CHECK_THAT(error_message([&] { mixprec::load_train_config(dir.path().string()); }),
             Contains("is a directory"));
}

TEST_CASE("config errors: a missing data file names the key and both places", "[config]") {
  ErrorTempDir dir;
  const fs::path work = dir.path() / "work";
  fs::create_directories(work);
  std::string message;
  {
    WorkingDir cwd(work);
    message = error_message([&] {
      mixprec::parse_train_config(kCnn, kOrigin, dir.path().string(),
                                  {"data.test_labels=labels/missing.idx"});
    });
  }
  CHECK_THAT(message,
             StartsWith(kOrigin + ": data.test_labels: file 'labels/missing.idx' not found"));
  const std::string next_to_config = (dir.path() / "labels/missing.idx").string();
  const std::string in_working_dir = (work / "labels/missing.idx").string();
  CHECK_THAT(message, Contains("'" + next_to_config + "' next to the config"));
  CHECK_THAT(message, Contains("'" + in_working_dir + "' in the working directory"));

  const std::string absolute = (dir.path() / "gone.txt").string();
  CHECK_THAT(parse_error(dir, kGpt, {"data.path=" + absolute}),
             Contains("data.path: file '" + absolute + "' not found"));
  // A folder is not a data file.
  fs::create_directories(dir.path() / "folder");
  CHECK_THAT(parse_error(dir, kGpt, {"data.path=folder"}),
             Contains("data.path: file 'folder' not found"));
}

TEST_CASE("config errors: malformed overrides and paths that do not fit", "[config]") {
  ErrorTempDir dir;
  CHECK(parse_error(dir, kCnn, {"noequals"}) ==
        kOrigin + ": --set 'noequals': expected key.path=value, e.g. train.steps=100");
  CHECK_THAT(parse_error(dir, kCnn, {"=5"}), Contains("--set '=5': the key before '=' is empty"));
  CHECK_THAT(parse_error(dir, kCnn, {"train..steps=5"}),
             Contains("--set 'train..steps=5': the key path 'train..steps' has an empty part"));
  CHECK_THAT(parse_error(dir, kCnn, {"train.=5"}), Contains("has an empty part"));
  CHECK_THAT(parse_error(dir, kCnn, {"train.steps[x]=5"}),
             Contains("'steps[x]' is not a key or key[index]"));
  CHECK_THAT(parse_error(dir, kCnn, {"train.epochs.x=1"}),
             Contains("--set 'train.epochs.x=1': 'train.epochs' is '3', not a map"));
  CHECK_THAT(parse_error(dir, kCnn, {"model.layers.x=1"}),
             Contains("'model.layers' is a list, not a map"));
  CHECK_THAT(parse_error(dir, kCnn, {"model.layers[7].conv=1"}),
             Contains("index 7 is past the end of 'model.layers' (5 items)"));
  CHECK_THAT(parse_error(dir, kCnn, {"train[0]=1"}), Contains("'train' is a map, not a list"));
  CHECK_THAT(parse_error(dir, kCnn, {"checkpoint[0]=1"}),
             Contains("there is no list 'checkpoint' to index"));
  CHECK_THAT(parse_error(dir, kCnn, {"train.steps=[1"}),
             Contains("--set 'train.steps=[1': malformed value '[1'"));

  // Unknown keys set by an override get suggestions and name the override.
  CHECK(parse_error(dir, kCnn, {"optimizer.lerning_rate=0.1"}) ==
        kOrigin +
            ": unknown key 'optimizer.lerning_rate' (did you mean 'lr'?) (from --set "
            "optimizer.lerning_rate=0.1)");
  CHECK(parse_error(dir, kCnn, {"optimzer.lr=0.1"}) ==
        kOrigin +
            ": unknown key 'optimzer' (did you mean 'optimizer'?) (from --set "
            "optimzer.lr=0.1)");
  CHECK(parse_error(dir, kCnn, {"train.batch_size=0"}) ==
        kOrigin + ": train.batch_size must be >= 1, got 0 (from --set train.batch_size=0)");
}
