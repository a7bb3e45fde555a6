// scripts/torch_bench.py trains a mixprec config in PyTorch and writes the bench.json rows that
// `mixprec bench --compare` merges. Here: a tiny CNN config on 512 Fashion-MNIST images and a
// tiny GPT on tiny shakespeare, a few steps each, and the rows checked against what they must
// be whatever the machine's speed: step times ordered, throughput = examples / median time,
// fp32's speedup exactly 1, losses near or below chance after training, accuracy a fraction.
// Bad input (a missing data file, a value with no torch equivalent, no config) exits 2 with
// one line on stderr naming the file.
//
// Skipped (with a warning) when no python3 with torch and yaml is found: MIXPREC_PYTHON if
// set, else `python3` on the PATH, else /usr/bin/python3 (Debian's python3-torch lives there).
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "torch_python.h"
#include "train_test_support.h"

using namespace train_test;
using mixprec_test::ScriptRun;

namespace {

// What scripts/torch_bench.py imports.
const char* const kBenchModules = "torch, yaml";

// scripts/torch_bench.py with `args`; its stdout and stderr go through files in `dir`.
ScriptRun run_bench(const ScratchDir& dir, const std::vector<std::string>& args) {
  return mixprec_test::run_script(mixprec_test::python_with(kBenchModules), "torch_bench.py",
                                  args, dir / "out.log", dir / "err.log");
}

const std::string kFashion = std::string(mixprec_test::kFashionMnistDir) + "/";

std::string tiny_cnn_config(const std::string& test_images) {
  return std::string("name: tiny_cnn\n"
                     "model:\n"
                     "  type: cnn\n"
                     "  in_channels: 1\n"
                     "  input_size: 28\n"
                     "  layers:\n"
                     "    - {conv: 8, kernel: 3, padding: 1}\n"
                     "    - batchnorm\n"
                     "    - relu\n"
                     "    - {maxpool: 2}\n"
                     "    - flatten\n"
                     "    - {linear: 10}\n"
                     "data:\n"
                     "  kind: idx\n"
                     "  train_images: ") +
         kFashion + "train-images-idx3-ubyte.gz\n  train_labels: " + kFashion +
         "train-labels-idx1-ubyte.gz\n  test_images: " + test_images +
         "\n  test_labels: " + kFashion +
         "t10k-labels-idx1-ubyte.gz\n"
         "  num_classes: 10\n"
         "  normalize: {mean: 0.2860, std: 0.3530}\n"
         "  limit_train: 512\n"
         "  limit_test: 256\n"
         "precision: fp32\n"
         "optimizer: {type: adam, lr: 0.002}\n"
         "schedule: {type: constant}\n"
         "train: {epochs: 1, batch_size: 32, seed: 0}\n"
         "device: cpu\n";
}

// The checks every trained row passes. `per_step` is examples (or tokens) per optimizer step,
// `chance_loss` the cross-entropy of a uniform guess.
void check_trained_row(const nlohmann::json& row, double per_step, const char* unit,
                       double chance_loss, int threads) {
  INFO(row.dump(2));
  for (const char* key :
       {"framework", "precision", "median_step_ms", "min_step_ms", "max_step_ms", "throughput",
        "throughput_unit", "peak_mem_mb", "final_loss", "val_loss", "val_accuracy",
        "skipped_steps", "final_scale", "host_syncs_per_step", "speedup_vs_fp32",
        "torch_version", "threads"})
    REQUIRE(row.contains(key));
  CHECK(row["framework"] == "torch");
  const double median = row["median_step_ms"], lo = row["min_step_ms"], hi = row["max_step_ms"];
  CHECK(median > 0.0);
  CHECK(lo <= median);
  CHECK(median <= hi);
  // Examples per second from the (rounded) median; throughput is rounded to 0.1.
  CHECK(row["throughput"].get<double>() ==
        Approx(per_step * 1000.0 / median).epsilon(1e-3).margin(0.1));
  CHECK(row["throughput_unit"] == unit);
  CHECK(row["peak_mem_mb"].get<double>() > 0.0);
  const double final_loss = row["final_loss"], val_loss = row["val_loss"];
  CHECK(std::isfinite(final_loss));
  CHECK(final_loss > 0.0);
  CHECK(final_loss < chance_loss + 1.0);
  CHECK(std::isfinite(val_loss));
  CHECK(val_loss > 0.0);
  CHECK(val_loss < chance_loss + 1.0);
  CHECK(row["skipped_steps"].get<int>() >= 0);
  CHECK(row["final_scale"].get<double>() > 0.0);
  CHECK(row["host_syncs_per_step"].is_null());
  CHECK(row["speedup_vs_fp32"].get<double>() > 0.0);
  CHECK(!row["torch_version"].get<std::string>().empty());
  CHECK(row["threads"] == threads);
}

// A row is either trained or says why it was skipped.
bool is_skipped(const nlohmann::json& row) {
  if (!row.contains("skipped")) return false;
  INFO(row.dump(2));
  CHECK(!row["skipped"].get<std::string>().empty());
  CHECK(!row.contains("median_step_ms"));
  return true;
}

bool fashion_mnist_available() {
  return fashion_mnist_installed();
}

}  // namespace

TEST_CASE("torch bench: a tiny cnn config gives plausible bench.json rows", "[apps][torch]") {
  if (!mixprec_test::python_available(kBenchModules)) return;
  if (!fashion_mnist_available()) {
    WARN("Fashion-MNIST is not installed (scripts/setup.sh installs dataset-fashion-mnist); "
         "skipped");
    return;
  }
  ScratchDir dir("torch-bench-cnn");
  write_text(dir / "tiny_cnn.yaml",
             tiny_cnn_config(std::string(kFashion) + "t10k-images-idx3-ubyte.gz"));
  const std::string out = dir / "bench";
  const ScriptRun run = run_bench(dir, {dir / "tiny_cnn.yaml", "--precisions", "fp32,fp16,bf16",
                                       "--steps", "6", "--warmup", "2", "--threads", "1",
                                       "--out", out, "--json"});
  INFO("stdout: " << run.out << "\nstderr: " << run.err);
  REQUIRE(run.code == 0);
  const nlohmann::json bench = read_json(out + "/bench.json");
  CHECK(nlohmann::json::parse(run.out) == bench);  // --json prints what it wrote
  CHECK(bench["name"] == "tiny_cnn");
  CHECK(bench["device"] == "cpu");
  CHECK(bench["steps"] == 6);
  CHECK(bench["warmup"] == 2);
  CHECK(bench["config"].get<std::string>().find("tiny_cnn.yaml") != std::string::npos);
  const nlohmann::json& rows = bench["rows"];
  REQUIRE(rows.size() == 3);
  CHECK(rows[0]["precision"] == "fp32");
  CHECK(rows[1]["precision"] == "fp16");
  CHECK(rows[2]["precision"] == "bf16");

  // Ten classes: chance is ln 10. Six Adam steps at lr 0.002 on 32 images each already beat a
  // uniform guess on the test images, and accuracy is well above chance (0.1).
  const double chance = std::log(10.0);
  const nlohmann::json& fp32 = rows[0];
  REQUIRE(!is_skipped(fp32));
  check_trained_row(fp32, 32, "samples/s", chance, 1);
  CHECK(fp32["speedup_vs_fp32"].get<double>() == 1.0);
  CHECK(fp32["skipped_steps"] == 0);
  CHECK(fp32["final_scale"].get<double>() == 1.0);
  CHECK(fp32["val_loss"].get<double>() < chance);
  const double accuracy = fp32["val_accuracy"];
  CHECK(accuracy >= 0.0);
  CHECK(accuracy <= 1.0);
  CHECK(accuracy > 0.2);
  // The accuracy of 256 test images is a multiple of 1/256.
  CHECK(accuracy * 256.0 == Approx(std::round(accuracy * 256.0)).margin(1e-9));

  for (size_t i = 1; i < rows.size(); ++i) {
    const nlohmann::json& row = rows[i];
    if (is_skipped(row)) continue;  // torch 1.13's CPU autocast has no float16
    check_trained_row(row, 32, "samples/s", chance, 1);
    const double accuracy_i = row["val_accuracy"];
    CHECK(accuracy_i >= 0.0);
    CHECK(accuracy_i <= 1.0);
    CHECK(row["speedup_vs_fp32"].get<double>() ==
          Approx(fp32["median_step_ms"].get<double>() / row["median_step_ms"].get<double>())
              .epsilon(2e-3));
    if (row["precision"] == "bf16") {
      CHECK(row["final_scale"].get<double>() == 1.0);  // no scaler
      CHECK(row["skipped_steps"] == 0);
    }
  }
}

TEST_CASE("torch bench: a tiny gpt config reports tokens and no accuracy", "[apps][torch]") {
  if (!mixprec_test::python_available(kBenchModules)) return;
  ScratchDir dir("torch-bench-gpt");
  const std::string out = dir / "bench";
  // The shipped config, shrunk: 8 windows of 16 tokens a step.
  const ScriptRun run = run_bench(
      dir, {config_path("gpt_shakespeare.yaml"), "--precisions", "fp32", "--steps", "8",
            "--warmup", "2", "--threads", "1", "--out", out, "--set",
            "data.path=" + shakespeare_path().string(), "--set", "model.n_layer=1", "--set",
            "model.n_embd=32", "--set", "model.n_head=2", "--set", "model.block_size=16", "--set",
            "train.batch_size=8", "--set", "data.eval_batches=4", "--set", "schedule.type=constant",
            "--set", "optimizer.lr=0.01", "--set", "device=cpu"});
  INFO("stdout: " << run.out << "\nstderr: " << run.err);
  REQUIRE(run.code == 0);
  CHECK(run.out.find("fp32") != std::string::npos);  // the table
  const nlohmann::json bench = read_json(out + "/bench.json");
  CHECK(bench["name"] == "gpt_shakespeare");
  REQUIRE(bench["rows"].size() == 1);
  const nlohmann::json& row = bench["rows"][0];
  REQUIRE(!is_skipped(row));
  // tiny shakespeare has 65 distinct characters: a uniform guess costs ln 65 a token, and
  // nanoGPT's N(0, 0.02) initialisation starts just there; eight steps at lr 0.01 go below.
  const double chance = std::log(65.0);
  check_trained_row(row, 8 * 16, "tokens/s", chance, 1);
  CHECK(row["val_accuracy"].is_null());
  CHECK(row["speedup_vs_fp32"].get<double>() == 1.0);
  CHECK(row["val_loss"].get<double>() < chance);
}

TEST_CASE("torch bench: bad input exits 2 with one line naming the file", "[apps][torch]") {
  if (!mixprec_test::python_available(kBenchModules)) return;
  ScratchDir dir("torch-bench-bad");
  auto one_line = [](const std::string& text) {
    return !text.empty() && text.find('\n') == text.size() - 1;
  };

  SECTION("a data file that does not exist") {
    const std::string missing = dir / "no-such-images.gz";
    write_text(dir / "missing.yaml", tiny_cnn_config(missing));
    const ScriptRun run = run_bench(dir, {dir / "missing.yaml", "--out", dir / "out"});
    INFO("stdout: " << run.out << "\nstderr: " << run.err);
    CHECK(run.code == 2);
    CHECK(one_line(run.err));
    CHECK(run.err.find(missing) != std::string::npos);
    CHECK(run.err.find("data.test_images") != std::string::npos);
    CHECK(!fs::exists(dir / "out"));
  }
  SECTION("an optimizer torch is not asked to map") {
    write_text(dir / "lamb.yaml",
               tiny_cnn_config(std::string(kFashion) + "t10k-images-idx3-ubyte.gz"));
    const ScriptRun run = run_bench(dir, {dir / "lamb.yaml", "--set", "optimizer.type=lamb",
                                         "--out", dir / "out"});
    INFO("stdout: " << run.out << "\nstderr: " << run.err);
    CHECK(run.code == 2);
    CHECK(one_line(run.err));
    CHECK(run.err.find(dir / "lamb.yaml") != std::string::npos);
    CHECK(run.err.find("optimizer.type") != std::string::npos);
    CHECK(run.err.find("lamb") != std::string::npos);
  }
  SECTION("a config that is not there, or not YAML") {
    const ScriptRun absent = run_bench(dir, {dir / "absent.yaml"});
    INFO("stderr: " << absent.err);
    CHECK(absent.code == 2);
    CHECK(one_line(absent.err));
    CHECK(absent.err.find(dir / "absent.yaml") != std::string::npos);

    write_text(dir / "broken.yaml", "model: {type: cnn\ndata: [\n");
    const ScriptRun broken = run_bench(dir, {dir / "broken.yaml"});
    INFO("stderr: " << broken.err);
    CHECK(broken.code == 2);
    CHECK(one_line(broken.err));
    CHECK(broken.err.find(dir / "broken.yaml") != std::string::npos);
  }
}
