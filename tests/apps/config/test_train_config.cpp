// The training-config loader on valid input: every field of a complete CNN and GPT config,
// the defaults, overrides, data-path resolution and the to_yaml round trip.
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "apps/config/suggest.h"
#include "apps/config/train_config.h"
#include "core/error.h"
#include "tests/apps/config/config_test_dirs.h"

namespace fs = std::filesystem;
using mixprec::CnnLayerSpec;
using mixprec::DataConfig;
using mixprec::ModelConfig;
using mixprec::TrainConfig;

using config_test::kMinimalCnn;
using config_test::parse_in;
using config_test::TempDir;
using config_test::WorkingDir;
using config_test::write_idx_files;

namespace {

const char* kFullCnn = R"(name: cnn_fashion
model:
  type: cnn
  in_channels: 3
  input_size: 32
  layers:
    - {conv: 32, kernel: 5, padding: 2, stride: 2, bias: false}
    - batchnorm
    - relu
    - {maxpool: 3, stride: 1, padding: 1}
    - {conv: 16}
    - gelu
    - {avgpool: 2}
    - flatten
    - {linear: 128, bias: false}
    - {dropout: 0.25}
    - {linear: 10}
data:
  kind: idx
  train_images: data/train-images
  train_labels: data/train-labels
  test_images: data/test-images
  test_labels: data/test-labels
  num_classes: 7
  normalize: {mean: 0.2860, std: 0.3530}
  limit_train: 1000
  limit_test: 200
  shuffle: false
precision: fp16
tf32: true
loss_scale: {policy: dynamic, init_scale: 1024, growth_factor: 4, backoff_factor: 0.25,
             growth_interval: 500, hysteresis: 3, hysteresis_mode: consecutive, min_scale: 2,
             max_scale: 65536, floor_policy: warn}
optimizer: {type: sgd, lr: 0.05, momentum: 0.9, nesterov: true, weight_decay: 5.0e-4,
            betas: [0.8, 0.99], eps: 1.0e-6}
schedule: {type: step, step_size: 300, gamma: 0.5, warmup_steps: 10, decay_steps: 900,
           min_lr: 0.001}
train: {epochs: 0, steps: 1500, batch_size: 64, accumulation_steps: 4, clip_grad_norm: 1.5,
        seed: 18446744073709551615, eval_every: 100, log_every: 25}
checkpoint: {every: 250, keep: 0, save_initial: true}
device: auto
debug: {detect_anomaly: true, inject_nonfinite: {step: 5, tensor: 0.weight, value: nan}}
)";

const char* kFullGpt = R"(model:
  type: gpt
  vocab_size: 65
  block_size: 64
  n_layer: 2
  n_head: 3
  n_embd: 96
  dropout: 0.1
  bias: false
  tie_weights: true
data:
  kind: text
  path: corpus/input.txt
  val_fraction: 0.2
  eval_batches: 5
  shuffle: false
precision: bf16
loss_scale:
  policy: static
  init_scale: 128
  growth_factor: 3
  backoff_factor: 0.75
  growth_interval: 100
  hysteresis: 2
  min_scale: 0.5
  max_scale: 1024
  floor_policy: error
optimizer:
  type: adamw
  lr: 6.0e-4
  momentum: 0.5
  nesterov: false
  weight_decay: 0.1
  betas: [0.9, 0.95]
  eps: 1.0e-9
schedule:
  type: cosine
  step_size: 7
  gamma: 0.9
  warmup_steps: 100
  decay_steps: 5000
  min_lr: 6.0e-5
train:
  steps: 5000
  batch_size: 12
  accumulation_steps: 2
  clip_grad_norm: 1.0
  seed: 1337
  eval_every: 250
  log_every: 10
  host_reads: at_log
  cuda_graph: true
checkpoint:
  every: 1000
  keep: 2
  save_initial: false
device: cuda
debug:
  detect_anomaly: false
)";

// Every field but source_path (which names the file a config came from).
void check_same(const TrainConfig& a, const TrainConfig& b) {
  CHECK(a.name == b.name);
  CHECK(a.model.type == b.model.type);
  CHECK(a.model.cnn.in_channels == b.model.cnn.in_channels);
  CHECK(a.model.cnn.input_size == b.model.cnn.input_size);
  REQUIRE(a.model.cnn.layers.size() == b.model.cnn.layers.size());
  for (size_t i = 0; i < a.model.cnn.layers.size(); ++i) {
    INFO("layer " << i);
    const CnnLayerSpec& x = a.model.cnn.layers[i];
    const CnnLayerSpec& y = b.model.cnn.layers[i];
    CHECK(x.kind == y.kind);
    CHECK(x.out == y.out);
    CHECK(x.kernel == y.kernel);
    CHECK(x.stride == y.stride);
    CHECK(x.padding == y.padding);
    CHECK(x.bias == y.bias);
    CHECK(x.p == y.p);
  }
  CHECK(a.model.gpt.vocab_size == b.model.gpt.vocab_size);
  CHECK(a.model.gpt.block_size == b.model.gpt.block_size);
  CHECK(a.model.gpt.n_layer == b.model.gpt.n_layer);
  CHECK(a.model.gpt.n_head == b.model.gpt.n_head);
  CHECK(a.model.gpt.n_embd == b.model.gpt.n_embd);
  CHECK(a.model.gpt.dropout == b.model.gpt.dropout);
  CHECK(a.model.gpt.bias == b.model.gpt.bias);
  CHECK(a.model.gpt.tie_weights == b.model.gpt.tie_weights);

  CHECK(a.data.kind == b.data.kind);
  CHECK(a.data.train_images == b.data.train_images);
  CHECK(a.data.train_labels == b.data.train_labels);
  CHECK(a.data.test_images == b.data.test_images);
  CHECK(a.data.test_labels == b.data.test_labels);
  CHECK(a.data.num_classes == b.data.num_classes);
  CHECK(a.data.mean == b.data.mean);
  CHECK(a.data.std == b.data.std);
  CHECK(a.data.limit_train == b.data.limit_train);
  CHECK(a.data.limit_test == b.data.limit_test);
  CHECK(a.data.path == b.data.path);
  CHECK(a.data.val_fraction == b.data.val_fraction);
  CHECK(a.data.eval_batches == b.data.eval_batches);
  CHECK(a.data.shuffle == b.data.shuffle);

  CHECK(a.precision == b.precision);
  CHECK(a.tf32 == b.tf32);
  CHECK(a.loss_scale.policy == b.loss_scale.policy);
  CHECK(a.loss_scale.init_scale == b.loss_scale.init_scale);
  CHECK(a.loss_scale.growth_factor == b.loss_scale.growth_factor);
  CHECK(a.loss_scale.backoff_factor == b.loss_scale.backoff_factor);
  CHECK(a.loss_scale.growth_interval == b.loss_scale.growth_interval);
  CHECK(a.loss_scale.hysteresis == b.loss_scale.hysteresis);
  CHECK(a.loss_scale.hysteresis_mode == b.loss_scale.hysteresis_mode);
  CHECK(a.loss_scale.min_scale == b.loss_scale.min_scale);
  CHECK(a.loss_scale.max_scale == b.loss_scale.max_scale);
  CHECK(a.loss_scale.floor_policy == b.loss_scale.floor_policy);

  CHECK(a.optimizer.type == b.optimizer.type);
  CHECK(a.optimizer.lr == b.optimizer.lr);
  CHECK(a.optimizer.momentum == b.optimizer.momentum);
  CHECK(a.optimizer.nesterov == b.optimizer.nesterov);
  CHECK(a.optimizer.weight_decay == b.optimizer.weight_decay);
  CHECK(a.optimizer.beta1 == b.optimizer.beta1);
  CHECK(a.optimizer.beta2 == b.optimizer.beta2);
  CHECK(a.optimizer.eps == b.optimizer.eps);

  CHECK(a.schedule.type == b.schedule.type);
  CHECK(a.schedule.step_size == b.schedule.step_size);
  CHECK(a.schedule.gamma == b.schedule.gamma);
  CHECK(a.schedule.warmup_steps == b.schedule.warmup_steps);
  CHECK(a.schedule.decay_steps == b.schedule.decay_steps);
  CHECK(a.schedule.min_lr == b.schedule.min_lr);

  CHECK(a.train.epochs == b.train.epochs);
  CHECK(a.train.steps == b.train.steps);
  CHECK(a.train.batch_size == b.train.batch_size);
  CHECK(a.train.accumulation_steps == b.train.accumulation_steps);
  CHECK(a.train.clip_grad_norm == b.train.clip_grad_norm);
  CHECK(a.train.seed == b.train.seed);
  CHECK(a.train.eval_every == b.train.eval_every);
  CHECK(a.train.log_every == b.train.log_every);
  CHECK(a.train.host_reads == b.train.host_reads);
  CHECK(a.train.cuda_graph == b.train.cuda_graph);

  CHECK(a.checkpoint.every == b.checkpoint.every);
  CHECK(a.checkpoint.keep == b.checkpoint.keep);
  CHECK(a.checkpoint.save_initial == b.checkpoint.save_initial);

  CHECK(a.device == b.device);
  CHECK(a.log.tensorboard == b.log.tensorboard);
  CHECK(a.debug.detect_anomaly == b.debug.detect_anomaly);
  CHECK(a.debug.inject_step == b.debug.inject_step);
  CHECK(a.debug.inject_tensor == b.debug.inject_tensor);
  CHECK(a.debug.inject_value == b.debug.inject_value);
}

}  // namespace

TEST_CASE("config: a complete CNN config fills every field", "[config]") {
  TempDir dir;
  write_idx_files(dir);
  const TrainConfig c = parse_in(dir, kFullCnn);

  CHECK(c.source_path == dir.file("test.yaml"));
  CHECK(c.name == "cnn_fashion");
  CHECK(c.model.type == ModelConfig::Type::Cnn);
  CHECK(c.model.cnn.in_channels == 3);
  CHECK(c.model.cnn.input_size == 32);
  using Kind = CnnLayerSpec::Kind;
  const std::vector<CnnLayerSpec>& layers = c.model.cnn.layers;
  REQUIRE(layers.size() == 11);
  // {conv: 32, kernel: 5, padding: 2, stride: 2, bias: false}
  CHECK(layers[0].kind == Kind::Conv);
  CHECK(layers[0].out == 32);
  CHECK(layers[0].kernel == 5);
  CHECK(layers[0].padding == 2);
  CHECK(layers[0].stride == 2);
  CHECK_FALSE(layers[0].bias);
  CHECK(layers[1].kind == Kind::BatchNorm);
  CHECK(layers[2].kind == Kind::ReLU);
  // {maxpool: 3, stride: 1, padding: 1}
  CHECK(layers[3].kind == Kind::MaxPool);
  CHECK(layers[3].kernel == 3);
  CHECK(layers[3].stride == 1);
  CHECK(layers[3].padding == 1);
  // {conv: 16}: kernel 3, padding 0, stride 1, bias
  CHECK(layers[4].kind == Kind::Conv);
  CHECK(layers[4].out == 16);
  CHECK(layers[4].kernel == 3);
  CHECK(layers[4].padding == 0);
  CHECK(layers[4].stride == 1);
  CHECK(layers[4].bias);
  CHECK(layers[5].kind == Kind::GELU);
  // {avgpool: 2}: the stride defaults to the kernel
  CHECK(layers[6].kind == Kind::AvgPool);
  CHECK(layers[6].kernel == 2);
  CHECK(layers[6].stride == 2);
  CHECK(layers[6].padding == 0);
  CHECK(layers[7].kind == Kind::Flatten);
  CHECK(layers[8].kind == Kind::Linear);
  CHECK(layers[8].out == 128);
  CHECK_FALSE(layers[8].bias);
  CHECK(layers[9].kind == Kind::Dropout);
  CHECK(layers[9].p == 0.25);
  CHECK(layers[10].kind == Kind::Linear);
  CHECK(layers[10].out == 10);
  CHECK(layers[10].bias);

  CHECK(c.data.kind == DataConfig::Kind::Idx);
  CHECK(c.data.train_images == (dir.path() / "data/train-images").string());
  CHECK(c.data.train_labels == (dir.path() / "data/train-labels").string());
  CHECK(c.data.test_images == (dir.path() / "data/test-images").string());
  CHECK(c.data.test_labels == (dir.path() / "data/test-labels").string());
  CHECK(c.data.num_classes == 7);
  REQUIRE(c.data.mean.has_value());
  REQUIRE(c.data.std.has_value());
  CHECK(*c.data.mean == 0.2860);
  CHECK(*c.data.std == 0.3530);
  CHECK(c.data.limit_train == 1000);
  CHECK(c.data.limit_test == 200);
  CHECK_FALSE(c.data.shuffle);

  CHECK(c.precision == "fp16");
  CHECK(c.tf32);
  CHECK(c.loss_scale.policy == "dynamic");
  CHECK(c.loss_scale.init_scale == 1024.0);
  CHECK(c.loss_scale.growth_factor == 4.0);
  CHECK(c.loss_scale.backoff_factor == 0.25);
  CHECK(c.loss_scale.growth_interval == 500);
  CHECK(c.loss_scale.hysteresis == 3);
  CHECK(c.loss_scale.hysteresis_mode == "consecutive");
  CHECK(c.loss_scale.min_scale == 2.0);
  CHECK(c.loss_scale.max_scale == 65536.0);
  CHECK(c.loss_scale.floor_policy == "warn");

  CHECK(c.optimizer.type == "sgd");
  CHECK(c.optimizer.lr == 0.05);
  CHECK(c.optimizer.momentum == 0.9);
  CHECK(c.optimizer.nesterov);
  CHECK(c.optimizer.weight_decay == 5.0e-4);
  CHECK(c.optimizer.beta1 == 0.8);
  CHECK(c.optimizer.beta2 == 0.99);
  CHECK(c.optimizer.eps == 1.0e-6);

  CHECK(c.schedule.type == "step");
  CHECK(c.schedule.step_size == 300);
  CHECK(c.schedule.gamma == 0.5);
  CHECK(c.schedule.warmup_steps == 10);
  CHECK(c.schedule.decay_steps == 900);
  CHECK(c.schedule.min_lr == 0.001);

  CHECK(c.train.epochs == 0);
  CHECK(c.train.steps == 1500);
  CHECK(c.train.batch_size == 64);
  CHECK(c.train.accumulation_steps == 4);
  CHECK(c.train.clip_grad_norm == 1.5);
  CHECK(c.train.seed == 18446744073709551615ull);  // 2^64 - 1: the whole uint64 range
  CHECK(c.train.eval_every == 100);
  CHECK(c.train.log_every == 25);

  CHECK(c.checkpoint.every == 250);
  CHECK(c.checkpoint.keep == 0);
  CHECK(c.checkpoint.save_initial);

  CHECK(c.device == "auto");
  CHECK(c.debug.detect_anomaly);
  CHECK(c.debug.inject_step == 5);
  CHECK(c.debug.inject_tensor == "0.weight");
  CHECK(c.debug.inject_value == "nan");
}

TEST_CASE("config: a complete GPT config fills every field", "[config]") {
  TempDir dir;
  dir.write("corpus/input.txt", "hello");
  const std::string path = dir.write("shakespeare_char.yaml", kFullGpt);
  const TrainConfig c = mixprec::load_train_config(path);

  CHECK(c.source_path == path);
  CHECK(c.name == "shakespeare_char");  // no name: the file's stem
  CHECK(c.train.host_reads == "at_log");
  CHECK(c.train.cuda_graph);
  CHECK(c.model.type == ModelConfig::Type::Gpt);
  CHECK(c.model.gpt.vocab_size == 65);
  CHECK(c.model.gpt.block_size == 64);
  CHECK(c.model.gpt.n_layer == 2);
  CHECK(c.model.gpt.n_head == 3);
  CHECK(c.model.gpt.n_embd == 96);
  CHECK(c.model.gpt.dropout == 0.1);
  CHECK_FALSE(c.model.gpt.bias);
  CHECK(c.model.gpt.tie_weights);
  CHECK(c.model.cnn.layers.empty());

  CHECK(c.data.kind == DataConfig::Kind::CharText);
  CHECK(c.data.path == (dir.path() / "corpus/input.txt").string());
  CHECK(c.data.val_fraction == 0.2);
  CHECK(c.data.eval_batches == 5);
  CHECK_FALSE(c.data.shuffle);
  CHECK(c.data.train_images.empty());

  CHECK(c.precision == "bf16");
  CHECK(c.loss_scale.policy == "static");
  CHECK(c.loss_scale.init_scale == 128.0);
  CHECK(c.loss_scale.growth_factor == 3.0);
  CHECK(c.loss_scale.backoff_factor == 0.75);
  CHECK(c.loss_scale.growth_interval == 100);
  CHECK(c.loss_scale.hysteresis == 2);
  CHECK(c.loss_scale.min_scale == 0.5);
  CHECK(c.loss_scale.max_scale == 1024.0);
  CHECK(c.loss_scale.floor_policy == "error");

  CHECK(c.optimizer.type == "adamw");
  CHECK(c.optimizer.lr == 6.0e-4);
  CHECK(c.optimizer.momentum == 0.5);
  CHECK_FALSE(c.optimizer.nesterov);
  CHECK(c.optimizer.weight_decay == 0.1);
  CHECK(c.optimizer.beta1 == 0.9);
  CHECK(c.optimizer.beta2 == 0.95);
  CHECK(c.optimizer.eps == 1.0e-9);

  CHECK(c.schedule.type == "cosine");
  CHECK(c.schedule.step_size == 7);
  CHECK(c.schedule.gamma == 0.9);
  CHECK(c.schedule.warmup_steps == 100);
  CHECK(c.schedule.decay_steps == 5000);
  CHECK(c.schedule.min_lr == 6.0e-5);

  CHECK(c.train.epochs == 0);
  CHECK(c.train.steps == 5000);
  CHECK(c.train.batch_size == 12);
  CHECK(c.train.accumulation_steps == 2);
  CHECK(c.train.clip_grad_norm == 1.0);
  CHECK(c.train.seed == 1337);
  CHECK(c.train.eval_every == 250);
  CHECK(c.train.log_every == 10);

  CHECK(c.checkpoint.every == 1000);
  CHECK(c.checkpoint.keep == 2);
  CHECK_FALSE(c.checkpoint.save_initial);

  CHECK(c.device == "cuda");
  CHECK_FALSE(c.debug.detect_anomaly);
  CHECK(c.debug.inject_step == -1);
}

TEST_CASE("config: unset settings take the documented defaults", "[config]") {
  TempDir dir;
  write_idx_files(dir);
  const TrainConfig c = parse_in(dir, kMinimalCnn);

  CHECK(c.name == "test");
  CHECK(c.model.type == ModelConfig::Type::Cnn);  // no type: cnn
  CHECK(c.model.cnn.in_channels == 1);
  CHECK(c.model.cnn.input_size == 28);
  REQUIRE(c.model.cnn.layers.size() == 2);
  CHECK(c.data.kind == DataConfig::Kind::Idx);  // train_images given: idx
  CHECK(c.data.num_classes == 10);
  CHECK_FALSE(c.data.mean.has_value());
  CHECK_FALSE(c.data.std.has_value());
  CHECK(c.data.limit_train == 0);
  CHECK(c.data.limit_test == 0);
  CHECK(c.data.shuffle);

  CHECK(c.precision == "fp32");
  CHECK_FALSE(c.tf32);
  CHECK(c.loss_scale.policy == "auto");
  CHECK(c.loss_scale.init_scale == 65536.0);
  CHECK(c.loss_scale.growth_factor == 2.0);
  CHECK(c.loss_scale.backoff_factor == 0.5);
  CHECK(c.loss_scale.growth_interval == 2000);
  CHECK(c.loss_scale.hysteresis == 1);
  CHECK(c.loss_scale.hysteresis_mode == "reset_on_growth");
  CHECK(c.loss_scale.min_scale == 1.0);
  CHECK(c.loss_scale.max_scale == 16777216.0);
  CHECK(c.loss_scale.floor_policy == "clamp");

  CHECK(c.optimizer.type == "sgd");
  CHECK(c.optimizer.lr == 0.01);
  CHECK(c.optimizer.momentum == 0.0);
  CHECK_FALSE(c.optimizer.nesterov);
  CHECK(c.optimizer.weight_decay == 0.0);
  CHECK(c.optimizer.beta1 == 0.9);
  CHECK(c.optimizer.beta2 == 0.999);
  CHECK(c.optimizer.eps == 1e-8);

  CHECK(c.schedule.type == "constant");
  CHECK(c.schedule.step_size == 1000);
  CHECK(c.schedule.gamma == 0.1);
  CHECK(c.schedule.warmup_steps == 0);
  CHECK(c.schedule.decay_steps == 0);
  CHECK(c.schedule.min_lr == 0.0);

  // Neither epochs nor steps: one epoch, so that the train section stays optional.
  CHECK(c.train.epochs == 1);
  CHECK(c.train.steps == 0);
  CHECK(c.train.batch_size == 128);
  CHECK(c.train.accumulation_steps == 1);
  CHECK(c.train.clip_grad_norm == 0.0);
  CHECK(c.train.seed == 0);
  CHECK(c.train.eval_every == 0);
  CHECK(c.train.log_every == 50);

  CHECK(c.checkpoint.every == 0);
  CHECK(c.checkpoint.keep == 3);
  CHECK_FALSE(c.checkpoint.save_initial);

  CHECK(c.device == "cpu");
  CHECK_FALSE(c.debug.detect_anomaly);
  CHECK(c.debug.inject_step == -1);
  CHECK(c.debug.inject_tensor.empty());
  CHECK(c.debug.inject_value == "inf");
}

TEST_CASE("config: GPT and text-data defaults, data kind inferred from path", "[config]") {
  TempDir dir;
  dir.write("input.txt");
  const TrainConfig c = parse_in(dir,
                                 "model: {type: gpt}\ndata: {path: input.txt}\n"
                                 "train: {steps: 10}\n");
  CHECK(c.model.type == ModelConfig::Type::Gpt);
  CHECK(c.model.gpt.vocab_size == 0);
  CHECK(c.model.gpt.block_size == 128);
  CHECK(c.model.gpt.n_layer == 4);
  CHECK(c.model.gpt.n_head == 4);
  CHECK(c.model.gpt.n_embd == 128);
  CHECK(c.model.gpt.dropout == 0.0);
  CHECK(c.model.gpt.bias);
  CHECK_FALSE(c.model.gpt.tie_weights);
  CHECK(c.data.kind == DataConfig::Kind::CharText);
  CHECK(c.data.val_fraction == 0.1);
  CHECK(c.data.eval_batches == 20);
  CHECK(c.train.epochs == 0);  // steps given: epochs stays 0
  CHECK(c.train.steps == 10);
}

TEST_CASE("config: empty sections and the YAML spellings of numbers and booleans", "[config]") {
  TempDir dir;
  write_idx_files(dir);
  std::string yaml = kMinimalCnn;
  // A section whose settings are all commented out is empty, not an error.
  yaml += "optimizer:\n  # lr: 0.1\n";
  yaml += "train: {epochs: +2, clip_grad_norm: 5, batch_size: 32}\n";
  yaml += "schedule: {min_lr: .5e-3, gamma: 1.}\n";
  yaml += "checkpoint: {save_initial: True}\n";
  yaml += "debug: {detect_anomaly: FALSE, inject_nonfinite: {step: 1, tensor: fc.bias}}\n";
  const TrainConfig c = parse_in(dir, yaml);
  CHECK(c.optimizer.lr == 0.01);
  CHECK(c.train.epochs == 2);
  CHECK(c.train.clip_grad_norm == 5.0);  // an integer is a valid real
  CHECK(c.train.batch_size == 32);
  CHECK(c.schedule.min_lr == 0.0005);
  CHECK(c.schedule.gamma == 1.0);
  CHECK(c.checkpoint.save_initial);
  CHECK_FALSE(c.debug.detect_anomaly);
  CHECK(c.debug.inject_step == 1);
  CHECK(c.debug.inject_tensor == "fc.bias");
  CHECK(c.debug.inject_value == "inf");
}

TEST_CASE("config: overrides change values before validation", "[config]") {
  TempDir dir;
  write_idx_files(dir);
  const TrainConfig c =
      parse_in(dir, kFullCnn,
               {"train.epochs=0", "train.steps=100", "precision=bf16", "optimizer.betas=[0.9,0.95]",
                "model.layers[0].conv=64", "model.layers[3]={avgpool: 4}",
                "loss_scale={policy: none}", "train.batch_size=8", "train.batch_size = 16",
                "name=a=b", "data.normalize.std=0.5", "debug.inject_nonfinite.tensor=fc.weight"});
  CHECK(c.train.epochs == 0);
  CHECK(c.train.steps == 100);
  CHECK(c.precision == "bf16");
  CHECK(c.optimizer.beta1 == 0.9);
  CHECK(c.optimizer.beta2 == 0.95);
  CHECK(c.model.cnn.layers[0].out == 64);
  CHECK(c.model.cnn.layers[0].kernel == 5);  // the rest of the item stays
  CHECK(c.model.cnn.layers[3].kind == CnnLayerSpec::Kind::AvgPool);
  CHECK(c.model.cnn.layers[3].kernel == 4);
  CHECK(c.model.cnn.layers[3].stride == 4);
  // A map value replaces the whole section: the file's other loss_scale settings are gone.
  CHECK(c.loss_scale.policy == "none");
  CHECK(c.loss_scale.init_scale == 65536.0);
  CHECK(c.train.batch_size == 16);  // the later one wins; spaces around the key are fine
  CHECK(c.name == "a=b");           // split at the first '='
  CHECK(*c.data.mean == 0.2860);
  CHECK(*c.data.std == 0.5);
  CHECK(c.debug.inject_tensor == "fc.weight");
  CHECK(c.debug.inject_step == 5);
}

TEST_CASE("config: overrides create missing sections", "[config]") {
  TempDir dir;
  write_idx_files(dir);
  const TrainConfig c = parse_in(dir, kMinimalCnn,
                                 {"checkpoint.every=10", "debug.inject_nonfinite.step=3",
                                  "debug.inject_nonfinite.tensor=1.weight", "device=cuda"});
  CHECK(c.checkpoint.every == 10);
  CHECK(c.checkpoint.keep == 3);
  CHECK(c.debug.inject_step == 3);
  CHECK(c.debug.inject_tensor == "1.weight");
  CHECK(c.device == "cuda");
}

TEST_CASE("config: auto is dynamic for fp16 and none otherwise", "[config]") {
  using mixprec::effective_loss_scale_policy;
  CHECK(effective_loss_scale_policy("auto", "fp16") == "dynamic");
  CHECK(effective_loss_scale_policy("auto", "fp32") == "none");
  CHECK(effective_loss_scale_policy("auto", "bf16") == "none");
  for (const std::string policy : {"dynamic", "static", "none"})
    CHECK(effective_loss_scale_policy(policy, "bf16") == policy);
}

TEST_CASE("config: overrides_set_key reads the texts as the loader does", "[config]") {
  using mixprec::overrides_set_key;
  const std::string key = "train.log_every";
  CHECK(overrides_set_key({"train.log_every=3"}, key));
  CHECK(overrides_set_key({" train.log_every =3"}, key));  // the loader trims the key
  CHECK(overrides_set_key({"train={log_every: 3, steps: 9}"}, key));
  CHECK(overrides_set_key({"train.steps=9", "train.log_every=3", "precision=fp16"}, key));
  // A later map replaces the section, and with it the key an earlier text gave.
  CHECK_FALSE(overrides_set_key({"train.log_every=3", "train={steps: 9}"}, key));
  CHECK_FALSE(overrides_set_key({"train={steps: 9}"}, key));
  CHECK_FALSE(overrides_set_key({"train.log_everyday=3", "train.eval_every=3"}, key));
  CHECK_FALSE(overrides_set_key({"log_every=3", "model.train.log_every=3"}, key));
  CHECK_FALSE(overrides_set_key({}, key));
  // Texts the loader refuses give nothing, nor do the maps they would have passed through;
  // the ones beside them still count.
  CHECK_FALSE(overrides_set_key({"train.log_every"}, key));
  CHECK_FALSE(overrides_set_key({"train.layers[0]=1"}, "train"));
  CHECK_FALSE(overrides_set_key({"train=5", "train.log_every=3"}, key));
  CHECK(overrides_set_key({"model.layers[0].conv=64", "train.log_every=3", "x[=1"}, key));
  CHECK(overrides_set_key({"train.log_every=3"}, "train"));
  CHECK_FALSE(overrides_set_key({"train.log_every=3"}, ""));
  // The loader's rule for the run length holds here too.
  CHECK_FALSE(overrides_set_key({"train={epochs: 2, log_every: 3}", "train.steps=9"},
                                "train.epochs"));
  CHECK(overrides_set_key({"train.epochs=2", "train.steps=9"}, "train.epochs"));
}

TEST_CASE("config: load_train_config applies overrides and keeps policy auto", "[config]") {
  TempDir dir;
  write_idx_files(dir);
  const std::string path = dir.write("runs.yaml", kMinimalCnn);
  const TrainConfig c = mixprec::load_train_config(path, {"precision=fp16"});
  CHECK(c.precision == "fp16");
  CHECK(c.loss_scale.policy == "auto");  // the trainer resolves it, the loader does not
  CHECK(c.name == "runs");
  CHECK(c.source_path == path);
}

TEST_CASE("config: relative data paths resolve against the config folder first", "[config]") {
  TempDir dir;
  const std::string next_to_config = dir.write("cfg/data/images");
  dir.write("cfg/data/train-labels");
  dir.write("cfg/data/test-images");
  dir.write("cfg/data/test-labels");
  dir.write("work/data/images");  // the same relative path under the working dir
  dir.write("work/only_in_cwd/labels");
  const std::string absolute = dir.write("elsewhere/test-labels");
  fs::create_directories(dir.path() / "work");
  const std::string config_path = dir.write("cfg/run.yaml", R"(model: {layers: [flatten]}
data:
  train_images: data/images
  train_labels: only_in_cwd/labels
  test_images: ./data/../data/test-images
  test_labels: )" + absolute + "\n");

  WorkingDir cwd(dir.path() / "work");
  const TrainConfig c = mixprec::load_train_config(config_path);
  CHECK(c.data.train_images == next_to_config);  // both exist: the config's folder wins
  CHECK(c.data.train_labels == dir.file("work/only_in_cwd/labels"));
  CHECK(c.data.test_images == dir.file("cfg/data/test-images"));  // normalized
  CHECK(c.data.test_labels == absolute);

  // parse_train_config resolves against base_dir, and a relative base_dir against the cwd.
  const TrainConfig relative_base = mixprec::parse_train_config(
      "model: {type: gpt}\ndata: {path: data/images}\n", "inline", "../cfg");
  CHECK(relative_base.data.path == next_to_config);
  CHECK(relative_base.name == "inline");
  CHECK(relative_base.source_path == "inline");
}

TEST_CASE("config: to_yaml writes every setting and reads back equal (CNN)", "[config]") {
  TempDir dir;
  write_idx_files(dir);
  const TrainConfig original = parse_in(dir, kFullCnn);
  const std::string yaml = mixprec::to_yaml(original);
  // Read back from another folder: the paths it wrote are absolute.
  TempDir other;
  const std::string path = other.write("config.yaml", yaml);
  const TrainConfig again = mixprec::load_train_config(path);
  check_same(original, again);
}

TEST_CASE("config: to_yaml writes every setting and reads back equal (GPT)", "[config]") {
  TempDir dir;
  dir.write("corpus/input.txt");
  const TrainConfig original = mixprec::load_train_config(dir.write("gpt.yaml", kFullGpt));
  const TrainConfig again = mixprec::parse_train_config(mixprec::to_yaml(original), "rt.yaml",
                                                        fs::temp_directory_path().string());
  check_same(original, again);
}

TEST_CASE("config: to_yaml writes the defaults too", "[config]") {
  TempDir dir;
  write_idx_files(dir);
  TrainConfig config = parse_in(dir, kMinimalCnn);
  const std::string yaml = mixprec::to_yaml(config);
  for (const char* key : {"name:",
                          "in_channels:",
                          "input_size:",
                          "num_classes:",
                          "limit_train:",
                          "limit_test:",
                          "shuffle:",
                          "precision:",
                          "tf32: false",
                          "policy: auto",
                          "init_scale:",
                          "growth_factor:",
                          "backoff_factor:",
                          "growth_interval:",
                          "hysteresis:",
                          "hysteresis_mode: reset_on_growth",
                          "min_scale:",
                          "max_scale:",
                          "floor_policy:",
                          "lr:",
                          "momentum:",
                          "nesterov:",
                          "weight_decay:",
                          "betas:",
                          "eps:",
                          "step_size:",
                          "gamma:",
                          "warmup_steps:",
                          "decay_steps:",
                          "min_lr:",
                          "epochs:",
                          "steps:",
                          "batch_size:",
                          "accumulation_steps:",
                          "clip_grad_norm:",
                          "seed:",
                          "eval_every:",
                          "log_every:",
                          "host_reads: auto",
                          "cuda_graph: false",
                          "every:",
                          "keep:",
                          "save_initial:",
                          "device:",
                          "tensorboard: true",
                          "detect_anomaly:"}) {
    INFO(key);
    CHECK(yaml.find(key) != std::string::npos);
  }
  // Real numbers always carry a '.', which YAML 1.1 readers need to see a float.
  CHECK(yaml.find("eps: 1.0e-08") != std::string::npos);
  CHECK(yaml.find("max_scale: 16777216.0") != std::string::npos);
  check_same(config, parse_in(dir, yaml));

  // Values that need care in YAML: a name that reads as null or a number, exact doubles.
  config.name = "null";
  config.optimizer.lr = 0.1 + 0.2;  // 0.30000000000000004
  config.loss_scale.init_scale = 1.0 / 3.0;
  config.loss_scale.min_scale = 1e-300;
  config.data.mean = -0.0;
  config.data.std = 1e10;
  config.train.clip_grad_norm = 2.0;
  const TrainConfig again = parse_in(dir, mixprec::to_yaml(config));
  check_same(config, again);
  CHECK(again.name == "null");
}

TEST_CASE("config: edit distance and suggestions", "[config]") {
  CHECK(mixprec::edit_distance("kitten", "sitting") == 3);  // the textbook example
  CHECK(mixprec::edit_distance("", "abc") == 3);
  CHECK(mixprec::edit_distance("lr", "lr") == 0);
  CHECK(mixprec::edit_distance("LR", "lr") == 0);  // case is ignored
  CHECK(mixprec::edit_distance("rellu", "relu") == 1);
  CHECK(mixprec::edit_distance("flaten", "flatten") == 1);
  CHECK(mixprec::edit_distance("ab", "ba") == 2);  // a swap is two edits here
  const std::vector<std::string> keys = {"epochs", "steps", "batch_size"};
  CHECK(mixprec::closest_match("step", keys) == std::optional<std::string>("steps"));
  CHECK(mixprec::closest_match("batch_sise", keys) == std::optional<std::string>("batch_size"));
  CHECK_FALSE(mixprec::closest_match("xyz", keys).has_value());
  CHECK_FALSE(mixprec::closest_match("epochsxyz", keys).has_value());  // distance 3
  const std::vector<std::pair<std::string, std::string>> spellings = {
      {"lr", "lr"}, {"learning_rate", "lr"}, {"eps", "eps"}};
  CHECK(mixprec::closest_match("lerning_rate", spellings) == std::optional<std::string>("lr"));
  CHECK(mixprec::closest_match("epss", spellings) == std::optional<std::string>("eps"));
}
