// Every config under configs/ loads, and the GPT configs run a step on the CPU (the full runs
// and their targets are measured by hand and stated in the README).
#include <catch2/catch.hpp>

#include "apps/config/train_config.h"
#include "train_test_support.h"

using namespace train_test;

TEST_CASE("every config under configs/ loads with the settings it documents", "[apps][train]") {
  const mixprec::TrainConfig cnn = mixprec::load_train_config(config_path("cnn_fashion.yaml"));
  CHECK(cnn.precision == "fp16");
  CHECK(cnn.train.epochs == 3);
  CHECK(cnn.model.cnn.layers.size() == 12);

  const mixprec::TrainConfig gpt = mixprec::load_train_config(config_path("gpt_shakespeare.yaml"));
  CHECK(gpt.model.gpt.n_layer == 4);
  CHECK(gpt.model.gpt.n_head == 4);
  CHECK(gpt.model.gpt.n_embd == 128);
  CHECK(gpt.model.gpt.block_size == 128);
  // Both GPT configs read the corpus shipped in the repository, so they run from any clone.
  CHECK(fs::equivalent(gpt.data.path, shakespeare_path()));

  const mixprec::TrainConfig gpu = mixprec::load_train_config(config_path("gpt_shakespeare_gpu.yaml"));
  CHECK(gpu.model.gpt.n_layer == 6);
  CHECK(gpu.model.gpt.n_head == 6);
  CHECK(gpu.model.gpt.n_embd == 384);
  CHECK(gpu.model.gpt.block_size == 256);
  CHECK(gpu.model.gpt.dropout == 0.2);
  CHECK(gpu.train.batch_size == 64);
  CHECK(gpu.train.steps == 5000);
  CHECK(gpu.device == "cuda");
  CHECK(fs::equivalent(gpu.data.path, shakespeare_path()));
}

TEST_CASE("the GPU GPT config trains a step on the CPU", "[apps][train]") {
  ScratchDir dir("gpu-config");
  const std::string run = dir / "run";
  const CliResult r = run_cli({"train", config_path("gpt_shakespeare_gpu.yaml"), "--out", run,
                               "--set", "device=cpu", "--set", "train.steps=2",
                               "--set", "train.batch_size=2", "--set", "data.eval_batches=1"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  const nlohmann::json summary = read_json(run + "/summary.json");
  CHECK(summary["steps"] == 2);
  CHECK(summary["precision"] == "fp16");
  // nanoGPT's shakespeare-char model without biases and 65 characters: 10.77M parameters
  // (nanoGPT prints 10.65M, leaving out the position embeddings).
  CHECK(summary["parameters"] == 12 * 6 * 384 * 384 + 65 * 384 * 2 + 256 * 384 + 13 * 384);
  // Chance level is ln(65) = 4.17; two steps cannot have learned much.
  CHECK(summary["val_loss"].get<double>() > 3.0);
}
