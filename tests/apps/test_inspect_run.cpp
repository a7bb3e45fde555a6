// `mixprec inspect` end to end: the gatherer's taps deliver the gradients backward computes,
// and run_inspect on a small CNN writes the documented report.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "apps/inspect/grad_gatherer.h"
#include "apps/inspect/inspect.h"
#include "apps/plot/gnuplot.h"
#include "core/error.h"
#include "core/ops/ops.h"
#include "layers/activations.h"
#include "layers/linear.h"
#include "layers/model_builder.h"
#include "layers/sequential.h"
#include "train_test_support.h"

using namespace mixprec;
using namespace mixprec::inspect;
using namespace train_test;

namespace {

std::shared_ptr<Sequential> small_mlp(uint64_t seed) {
  Generator init(seed);
  auto seq = std::make_shared<Sequential>();
  seq->append(std::make_shared<Linear>(3, 5, true, init));
  seq->append(std::make_shared<ReLU>());
  seq->append(std::make_shared<Linear>(5, 4, true, init));
  seq->assign_names();
  return seq;
}

Batch small_batch() {
  Generator gen(3);
  Batch batch;
  batch.inputs = Tensor::uniform({6, 3}, gen, -1.f, 1.f);
  batch.targets = Tensor::from_ints({0, 1, 2, 3, 1, 2}, {6});
  return batch;
}

GradHistogram histogram_of(const Tensor& t, double scale) {
  GradHistogram h = make_grad_histogram(scale);
  add_values(h, t.to_float_vector());
  return h;
}

void check_same_counts(const GradHistogram& got, const GradHistogram& expected) {
  CHECK(got.elements == expected.elements);
  CHECK(got.zeros == expected.zeros);
  CHECK(got.bins == expected.bins);
  CHECK(got.flushed_unscaled == expected.flushed_unscaled);
  CHECK(got.subnormal_unscaled == expected.subnormal_unscaled);
  CHECK(got.flushed_scaled == expected.flushed_scaled);
  CHECK(got.overflow_scaled == expected.overflow_scaled);
}

// The cnn_fashion config shrunk to a 6-layer CNN, batches of 16 and a few hundred images.
std::vector<std::string> tiny_cnn(const std::string& precision) {
  return {"precision=" + precision,
          "model.layers=[{conv: 4, kernel: 3, padding: 1}, batchnorm, relu, {maxpool: 2}, "
          "flatten, {linear: 10}]",
          "train.epochs=0", "train.steps=20", "train.batch_size=16",
          "data.limit_train=256", "data.limit_test=32", "device=cpu"};
}

// run_inspect's options for tiny_cnn(`precision`), the report going into `dir`.
InspectOptions tiny_cnn_options(const ScratchDir& dir, const std::string& precision) {
  InspectOptions options;
  options.config_path = config_path("cnn_fashion.yaml");
  options.overrides = tiny_cnn(precision);
  options.out_dir = dir / "report";
  return options;
}

}  // namespace

TEST_CASE("inspect: the gatherer counts the gradients backward computes", "[inspect]") {
  auto model = small_mlp(1);
  auto reference = small_mlp(1);  // the same weights, without hooks
  const Batch batch = small_batch();
  const double scale = 1024.0;

  // Reference: the logits' gradient through a leaf copy of the logits, and the parameters'.
  Tensor h = (*reference->at(1))((*reference->at(0))(batch.inputs));
  Tensor logits = (*reference->at(2))(h).detach();
  logits.set_requires_grad(true);
  ops::cross_entropy(logits, batch.targets).backward();
  const Tensor logits_grad = logits.grad();
  ops::cross_entropy((*reference)(batch.inputs), batch.targets).backward();

  GatheredGradients gathered;
  {
    GradGatherer gatherer(*model, scale);
    CHECK(gatherer.layer_names() == std::vector<std::string>{"0", "1", "2"});
    gatherer.gather_batch(batch, kCPU);
    gathered = gatherer.result();
  }
  for (size_t i = 0; i < 3; ++i) CHECK_FALSE(model->at(i)->has_forward_hook());

  REQUIRE(gathered.activations.size() == 3);
  CHECK(gathered.activations[2].name == "2");
  check_same_counts(gathered.activations[2].histogram, histogram_of(logits_grad, scale));
  CHECK(gathered.activations[0].histogram.elements == 6 * 5);
  CHECK(gathered.activations[1].histogram.elements == 6 * 5);

  const auto params = reference->named_parameters();
  REQUIRE(gathered.weights.size() == params.size());
  int64_t nonzero = gathered.activations[0].histogram.nonzero() +
                    gathered.activations[1].histogram.nonzero() +
                    gathered.activations[2].histogram.nonzero();
  for (size_t i = 0; i < params.size(); ++i) {
    INFO(params[i].first);
    CHECK(gathered.weights[i].name == params[i].first);
    check_same_counts(gathered.weights[i].histogram, histogram_of(params[i].second.grad(), scale));
    nonzero += gathered.weights[i].histogram.nonzero();
  }
  CHECK(gathered.profile.nonzero() == nonzero);
  for (const auto& [name, param] : model->named_parameters()) CHECK_FALSE(param.grad().defined());
}

TEST_CASE("inspect: the gatherer taps every leaf and every block of a GPT", "[inspect]") {
  const GptSpec spec{.vocab_size = 9, .block_size = 4, .n_layer = 1, .n_head = 2, .n_embd = 8};
  Generator init(2);
  auto model = build_gpt(spec, init, std::make_shared<Generator>(3));
  GradGatherer gatherer(*model, 1.0);
  const std::vector<std::string> expected = {
      "transformer.wte", "transformer.wpe", "transformer.drop", "transformer.h.0",
      "transformer.h.0.ln_1", "transformer.h.0.attn.c_attn", "transformer.h.0.attn.c_proj",
      "transformer.h.0.attn.resid_dropout", "transformer.h.0.ln_2", "transformer.h.0.mlp.c_fc",
      "transformer.h.0.mlp.gelu", "transformer.h.0.mlp.c_proj", "transformer.h.0.mlp.dropout",
      "transformer.ln_f", "lm_head"};
  CHECK(gatherer.layer_names() == expected);
  Batch batch;
  batch.inputs = Tensor::from_ints({1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
  batch.targets = Tensor::from_ints({2, 3, 4, 5, 6, 7, 8, 0}, {2, 4});
  gatherer.gather_batch(batch, kCPU);
  const GatheredGradients gathered = gatherer.result();
  std::vector<std::string> names;
  for (const NamedHistogram& entry : gathered.activations) {
    names.push_back(entry.name);
    // Outputs [B, T, C] = [2, 4, 8], except wpe's [T, C], lm_head's [B, T, vocab], c_attn's
    // [B, T, 3C] and c_fc's and gelu's [B, T, 4C].
    const std::map<std::string, int64_t> widths = {{"lm_head", 9},
                                                   {"transformer.h.0.attn.c_attn", 24},
                                                   {"transformer.h.0.mlp.c_fc", 32},
                                                   {"transformer.h.0.mlp.gelu", 32}};
    const int64_t width = widths.count(entry.name) ? widths.at(entry.name) : 8;
    const int64_t rows = entry.name == "transformer.wpe" ? 4 : 8;
    INFO(entry.name);
    CHECK(entry.histogram.elements == rows * width);
  }
  CHECK(names == expected);
  // No tied weights here: one entry per parameter.
  CHECK(gathered.weights.size() == model->named_parameters().size());
}

TEST_CASE("inspect: a run on a small CNN writes the documented report", "[inspect]") {
  if (!fashion_mnist_installed()) {
    WARN("Fashion-MNIST is not installed; skipped");
    return;
  }
  ScratchDir dir("inspect");
  InspectOptions options = tiny_cnn_options(dir, "fp16");
  options.steps = 2;
  options.batches = 2;
  std::ostringstream log;
  const nlohmann::json report = run_inspect(options, log);
  INFO(log.str());

  const nlohmann::json written = read_json(options.out_dir + "/inspect.json");
  CHECK(written == report);
  for (const char* key : {"config", "precision", "steps", "batches", "scale", "recommended_scale",
                          "fp16", "activations", "weights", "at_risk"})
    CHECK(report.contains(key));
  CHECK(report["precision"] == "fp16");
  CHECK(report["steps"] == 2);
  CHECK(report["batches"] == 2);
  CHECK(report["fp16"]["max"] == 65504.0);
  CHECK(report["fp16"]["min_normal"] == std::ldexp(1.0, -14));
  CHECK(report["fp16"]["min_subnormal"] == std::ldexp(1.0, -24));
  // Dynamic scaling from 2^16, halved on each skipped step and not grown in two steps.
  CHECK(report["scale"].get<double>() ==
        std::ldexp(65536.0, -report["skipped_steps"].get<int>()));
  const int log2 = report["recommendation"]["log2"].get<int>();
  CHECK(log2 >= -24);
  CHECK(log2 <= 40);
  CHECK(report["recommended_scale"].get<double>() == std::ldexp(1.0, log2));

  // Layer outputs per batch of 16: conv [16, 4, 28, 28], batchnorm and relu the same, maxpool
  // [16, 4, 14, 14], flatten [16, 784], linear [16, 10]; two batches.
  const std::vector<std::pair<std::string, int64_t>> layers = {
      {"0", 16 * 4 * 28 * 28}, {"1", 16 * 4 * 28 * 28}, {"2", 16 * 4 * 28 * 28},
      {"3", 16 * 4 * 14 * 14}, {"4", 16 * 784},         {"5", 16 * 10}};
  const std::vector<std::pair<std::string, int64_t>> tensors = {
      {"0.weight", 4 * 9}, {"0.bias", 4}, {"1.weight", 4}, {"1.bias", 4},
      {"5.weight", 10 * 784}, {"5.bias", 10}};
  std::set<std::string> at_risk;
  auto check_entries = [&](const nlohmann::json& entries, const char* key,
                           const std::vector<std::pair<std::string, int64_t>>& expected) {
    REQUIRE(entries.size() == expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      const nlohmann::json& e = entries[i];
      INFO(key << " " << expected[i].first);
      CHECK(e[key] == expected[i].first);
      CHECK(e["elements"] == 2 * expected[i].second);
      int64_t sum = e["zeros"].get<int64_t>() + e["underflow_bin"].get<int64_t>() +
                    e["overflow_bin"].get<int64_t>();
      REQUIRE(e["bins"].size() == 60);
      CHECK(e["bins"][0]["log2"] == -40);
      CHECK(e["bins"][59]["log2"] == 19);
      for (const auto& b : e["bins"]) sum += b["count"].get<int64_t>();
      CHECK(sum == e["elements"].get<int64_t>());
      for (const char* f : {"underflow_fraction_unscaled", "underflow_fraction_scaled",
                            "overflow_fraction_scaled", "subnormal_fraction_unscaled"}) {
        CHECK(e[f].get<double>() >= 0.0);
        CHECK(e[f].get<double>() <= 1.0);
      }
      if (e["underflow_fraction_unscaled"].get<double>() > 0.01) at_risk.insert(e[key]);
    }
  };
  check_entries(report["activations"], "layer", layers);
  check_entries(report["weights"], "tensor", tensors);
  CHECK(report["at_risk"].get<std::set<std::string>>() == at_risk);

  CHECK(fs::exists(options.out_dir + "/summary.txt"));
  CHECK(read_text(options.out_dir + "/summary.txt").find("Recommended scale") != std::string::npos);
  if (gnuplot_available()) {
    for (const char* png : {"activation_gradients.png", "weight_gradients.png"}) {
      INFO(png);
      const std::string bytes = read_text(options.out_dir + "/" + png);
      REQUIRE(bytes.size() > 8);
      CHECK(bytes.substr(1, 3) == "PNG");
    }
  } else {
    WARN("gnuplot is not installed: the charts were not rendered");
  }

  // A second report into the same folder is refused before anything is written.
  CHECK_THROWS_WITH(run_inspect(options, log), Catch::Contains("already holds an inspect report"));
}

TEST_CASE("inspect: an fp32 config is reported with the scale its fp16 run would start with",
          "[inspect]") {
  if (!fashion_mnist_installed()) {
    WARN("Fashion-MNIST is not installed; skipped");
    return;
  }
  ScratchDir dir("inspect-fp32");
  const InspectOptions options = tiny_cnn_options(dir, "fp32");
  std::ostringstream log;
  const nlohmann::json report = run_inspect(options, log);
  CHECK(report["scale"] == 65536.0);
  CHECK(report["steps"] == 0);
  CHECK(read_text(options.out_dir + "/summary.txt").find("fp32 trains without loss scaling") !=
        std::string::npos);

  // The config's own init_scale, as `auto` at fp16 would take it; none stays none.
  InspectOptions own_scale = tiny_cnn_options(dir, "fp32");
  own_scale.out_dir = dir / "own-scale";
  own_scale.overrides.push_back("loss_scale.init_scale=1024");
  CHECK(run_inspect(own_scale, log)["scale"] == 1024.0);
  InspectOptions no_scale = tiny_cnn_options(dir, "fp32");
  no_scale.out_dir = dir / "no-scale";
  no_scale.overrides.push_back("loss_scale.policy=none");
  CHECK(run_inspect(no_scale, log)["scale"] == 1.0);
}

TEST_CASE("inspect: bad input is refused before anything is written", "[inspect]") {
  ScratchDir dir("inspect-bad");
  InspectOptions options = tiny_cnn_options(dir, "fp16");
  std::ostringstream log;
  options.steps = -1;
  CHECK_THROWS_WITH(run_inspect(options, log), Catch::Contains("--steps"));
  options.steps = 0;
  options.batches = 0;
  CHECK_THROWS_WITH(run_inspect(options, log), Catch::Contains("--batches"));
  options.batches = 1;
  options.overrides.push_back("train.batch_size=0");
  CHECK_THROWS_AS(run_inspect(options, log), Error);
  CHECK_FALSE(fs::exists(options.out_dir));
}
