// A checkpoint written by `mixprec train` loads into the equivalent torch.nn model with
// load_state_dict(strict=True), and torch computes the same loss, the same gradients and the
// same SGD step on the same batch (scripts/torch_check_checkpoint.py does the torch side).
//
// Here: train a few steps so that a real checkpoint exists, rebuild the model from the same
// config, load that checkpoint, and compute on train batch 0, in FP32 on the CPU in training
// mode, the loss, every parameter's gradient and the masters after one plain SGD step. These
// go into a reference safetensors file with the model's description; torch recomputes them
// from the checkpoint alone, in float64.
//
// Skipped (with a warning) when no python3 with torch is found: MIXPREC_PYTHON if set, else
// `python3` on the PATH, else /usr/bin/python3 (Debian's python3-torch lives there, and a
// python3 earlier on the PATH may be another installation without it).
#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/checkpoint/checkpoint_dir.h"
#include "apps/checkpoint/safetensors.h"
#include "apps/config/train_config.h"
#include "apps/train/batch_loss.h"
#include "apps/train/training_setup.h"
#include "core/ops/ops.h"
#include "optim/sgd.h"
#include "torch_python.h"
#include "train_test_support.h"

using namespace train_test;
using mixprec_test::ScriptRun;

namespace {

constexpr double kLr = 0.1;

// What scripts/torch_check_checkpoint.py imports.
const char* const kCheckModules = "torch, numpy";

// scripts/torch_check_checkpoint.py on `checkpoint` against `reference`; `out` of the result
// holds stdout and stderr together, as written to `log`.
ScriptRun run_check_script(const std::string& checkpoint, const std::string& reference,
                           const std::string& log) {
  return mixprec_test::run_script(
      mixprec_test::python_with(kCheckModules), "torch_check_checkpoint.py",
      {"--checkpoint", checkpoint, "--reference", reference, "--rtol", "1e-4"}, log);
}

// The model as the script's --reference metadata describes it.
nlohmann::json describe_model(const mixprec::TrainConfig& config, int64_t data_classes) {
  using mixprec::CnnLayerSpec;
  nlohmann::json d;
  if (config.model.type == mixprec::ModelConfig::Type::Gpt) {
    const mixprec::GptSpec& g = config.model.gpt;
    d = {{"type", "gpt"},
         {"vocab_size", g.vocab_size > 0 ? g.vocab_size : data_classes},
         {"block_size", g.block_size},
         {"n_layer", g.n_layer},
         {"n_head", g.n_head},
         {"n_embd", g.n_embd},
         {"dropout", g.dropout},
         {"bias", g.bias},
         {"tie_weights", g.tie_weights}};
    return d;
  }
  const mixprec::CnnSpec& c = config.model.cnn;
  d = {{"type", "cnn"}, {"in_channels", c.in_channels}, {"input_size", c.input_size}};
  nlohmann::json layers = nlohmann::json::array();
  for (const CnnLayerSpec& l : c.layers) {
    nlohmann::json layer{{"kind", mixprec::cnn_layer_kind_name(l.kind)}};
    switch (l.kind) {
      case CnnLayerSpec::Kind::Conv:
        layer.update({{"out", l.out}, {"kernel", l.kernel}, {"stride", l.stride},
                      {"padding", l.padding}, {"bias", l.bias}});
        break;
      case CnnLayerSpec::Kind::MaxPool:
      case CnnLayerSpec::Kind::AvgPool:
        layer.update({{"kernel", l.kernel}, {"stride", l.stride <= 0 ? l.kernel : l.stride},
                      {"padding", l.padding}});
        break;
      case CnnLayerSpec::Kind::Linear:
        layer.update({{"out", l.out}, {"bias", l.bias}});
        break;
      case CnnLayerSpec::Kind::Dropout:
        layer["p"] = l.p;
        break;
      default:
        break;
    }
    layers.push_back(layer);
  }
  d["layers"] = layers;
  return d;
}

// Rebuilds the model of `config` with the weights of `checkpoint`, and writes to `path` what
// it computes on train batch 0 (see the top of this file), in training mode or, with
// `eval_mode`, in evaluation mode (batch norm on the checkpoint's running statistics).
void write_reference(const mixprec::TrainConfig& config, const std::string& checkpoint,
                     const std::string& path, bool eval_mode = false) {
  using mixprec::Tensor;
  const auto source = mixprec::make_batch_source(config);
  mixprec::Generator init(config.train.seed + 12345);  // weights come from the checkpoint
  auto dropout_gen = std::make_shared<mixprec::Generator>(config.train.seed);
  auto model = mixprec::make_model(config, source->num_classes(), init, dropout_gen, mixprec::kCPU);
  model->load_state_dict(mixprec::load_checkpoint(checkpoint).model, true);
  model->train(!eval_mode);

  const mixprec::Batch batch = source->train_batch(0);
  const mixprec::BatchLoss out = mixprec::batch_loss(*model, batch, mixprec::kCPU,
                                                     mixprec::DType::F32);
  out.loss.backward();

  std::vector<std::pair<std::string, Tensor>> tensors{{"inputs", batch.inputs},
                                                      {"targets", batch.targets},
                                                      {"loss", out.loss.detach().clone()}};
  const auto params = model->named_parameters();
  for (const auto& [name, p] : params) {
    REQUIRE(p.grad().defined());
    tensors.emplace_back("grad." + name, p.grad().clone());
  }
  mixprec::SgdOptions options;
  options.lr = kLr;
  mixprec::SGD(model->parameters(), options).step();
  for (const auto& [name, p] : params) tensors.emplace_back("stepped." + name, p.master().clone());

  mixprec::write_safetensors(path, tensors,
                             {{"model", describe_model(config, source->num_classes()).dump()},
                              {"mode", eval_mode ? "eval" : "train"},
                              {"lr", "0.1"}});
}

// `train` with `overrides` for a few steps, then the torch check of its final checkpoint.
// Returns the checkpoint and reference paths for further checks.
std::pair<std::string, std::string> train_and_check(const ScratchDir& dir, const char* config,
                                                     const std::vector<std::string>& overrides,
                                                     int steps) {
  const std::string run = dir / "run";
  std::vector<std::string> args{"train", config_path(config), "--out", run};
  for (const std::string& o : overrides) args.insert(args.end(), {"--set", o});
  const CliResult r = run_cli(args);
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.code == 0);

  const std::string checkpoint = run + "/checkpoints/step_" + std::to_string(steps);
  const std::string reference = dir / "reference.safetensors";
  write_reference(mixprec::load_train_config(config_path(config), overrides), checkpoint,
                  reference);

  const ScriptRun check = run_check_script(checkpoint, reference, dir / "check.log");
  INFO(check.out);
  REQUIRE(check.code == 0);
  return {checkpoint, reference};
}

// A small GPT; three AdamW steps at a high constant lr move the weights well away from
// nanoGPT's N(0, 0.02) init, whose tiny activations would hide differences such as GELU's
// tanh form against the erf form (they differ by ~1e-8 at |x| ~ 0.1).
std::vector<std::string> gpt_overrides(bool bias, bool tie_weights) {
  return {"data.path=" + shakespeare_path().string(),
          "model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=16",
          "model.dropout=0", std::string("model.bias=") + (bias ? "true" : "false"),
          std::string("model.tie_weights=") + (tie_weights ? "true" : "false"),
          "precision=fp32", "optimizer.lr=0.03", "optimizer.weight_decay=0",
          "schedule.type=constant", "train.steps=3", "train.batch_size=8", "train.log_every=1", "train.eval_every=0",
          "data.eval_batches=2", "checkpoint.every=0", "device=cpu"};
}

}  // namespace

TEST_CASE("torch check: a cnn_fashion checkpoint computes the same in torch", "[apps][torch]") {
  if (!mixprec_test::python_available(kCheckModules)) return;
  if (!fashion_mnist_installed()) {
    WARN("Fashion-MNIST is not installed (scripts/setup.sh installs dataset-fashion-mnist); skipped");
    return;
  }
  ScratchDir dir("torch-cnn");
  // Constant lr so that three Adam steps move every weight off its initial value.
  const std::vector<std::string> overrides{
      "precision=fp32", "schedule.type=constant", "train.steps=3",
      "train.batch_size=16", "train.log_every=1", "train.eval_every=0",
      "data.limit_train=256", "data.limit_test=64", "checkpoint.every=0",
      "device=cpu"};
  const auto [checkpoint, reference] = train_and_check(dir, "cnn_fashion.yaml", overrides, 3);

  // Evaluation mode: batch norm normalises with the checkpoint's running statistics, which
  // three training steps moved (momentum 0.1, unbiased variance, as torch updates them).
  const std::string eval_reference = dir / "eval_reference.safetensors";
  write_reference(mixprec::load_train_config(config_path("cnn_fashion.yaml"), overrides),
                  checkpoint, eval_reference, true);
  const ScriptRun eval_check = run_check_script(checkpoint, eval_reference, dir / "eval.log");
  INFO(eval_check.out);
  CHECK(eval_check.code == 0);
}

TEST_CASE("torch check: gpt checkpoints compute the same in torch, tampering is caught",
          "[apps][torch]") {
  if (!mixprec_test::python_available(kCheckModules)) return;

  SECTION("biases, untied lm_head; a changed gradient exits 1, a missing tensor exits 2") {
    ScratchDir dir("torch-gpt");
    const auto [checkpoint, reference] = train_and_check(dir, "gpt_shakespeare.yaml",
                                                         gpt_overrides(true, false), 3);

    // The same reference with one gradient 1% larger: a difference of 1e-2 relative to that
    // tensor's maximum, a hundred times the tolerance.
    mixprec::SafetensorsFile file = mixprec::read_safetensors(reference);
    std::vector<std::pair<std::string, mixprec::Tensor>> tampered;
    for (const auto& [name, t] : file.tensors) {
      tampered.emplace_back(name, name == "grad.transformer.h.1.mlp.c_fc.weight"
                                      ? mixprec::ops::mul_scalar(t, 1.01)
                                      : t);
    }
    REQUIRE(file.tensors.count("grad.transformer.h.1.mlp.c_fc.weight") == 1);
    const std::string tampered_path = dir / "tampered.safetensors";
    mixprec::write_safetensors(tampered_path, tampered, file.metadata);
    const ScriptRun differs = run_check_script(checkpoint, tampered_path, dir / "differs.log");
    INFO(differs.out);
    CHECK(differs.code == 1);
    CHECK(differs.out.find("grad.transformer.h.1.mlp.c_fc.weight") != std::string::npos);

    // A checkpoint without lm_head.weight: load_state_dict(strict=True) refuses it (exit 2).
    const auto stored = mixprec::read_safetensors(checkpoint + "/model.safetensors");
    std::vector<std::pair<std::string, mixprec::Tensor>> partial;
    for (const auto& [name, t] : stored.tensors) {
      if (name != "lm_head.weight") partial.emplace_back(name, t);
    }
    REQUIRE(partial.size() + 1 == stored.tensors.size());
    const std::string broken = dir / "broken";
    fs::create_directories(broken);
    mixprec::write_safetensors(broken + "/model.safetensors", partial, stored.metadata);
    const ScriptRun missing = run_check_script(broken, reference, dir / "missing.log");
    INFO(missing.out);
    CHECK(missing.code == 2);
    CHECK(missing.out.find("lm_head.weight") != std::string::npos);
  }

  SECTION("no biases (the config's own setting), lm_head tied to the token embedding") {
    ScratchDir dir("torch-gpt-tied");
    train_and_check(dir, "gpt_shakespeare.yaml", gpt_overrides(false, true), 3);
  }
}
