// `mixprec bench` end to end on a tiny CNN over the MNIST test set (present in every
// checkout): one run per precision in one process, bench.json's rows checked against the run
// folders each run wrote, the --compare rows, the charts, and bad input refused before any
// run folder appears.
#include <catch2/catch.hpp>

#include <cmath>
#include <sstream>
#include <utility>

#include "apps/bench/bench.h"
#include "apps/bench/peak_memory.h"
#include "apps/plot/gnuplot.h"
#include "apps/train/run_stats.h"
#include "core/cpu/bf16_dot_gemm.h"
#include "core/cpu/f16_gemm.h"
#include "core/error.h"
#include "train_test_support.h"

using namespace train_test;

namespace {

// A CNN small enough that a step takes milliseconds: one 4-channel convolution, batch norm,
// pooling and a linear layer, batches of 16 from 256 images, evaluated on 64.
std::string write_tiny_config(const ScratchDir& dir) {
  const std::string images = (mnist_dir() / "t10k-images-idx3-ubyte.gz").string();
  const std::string labels = (mnist_dir() / "t10k-labels-idx1-ubyte.gz").string();
  const std::string path = dir / "tiny_cnn.yaml";
  write_text(path,
             "name: tiny_cnn\n"
             "model:\n  type: cnn\n  in_channels: 1\n  input_size: 28\n"
             "  layers: [{conv: 4, kernel: 3, padding: 1}, batchnorm, relu, {maxpool: 2}, "
             "flatten, {linear: 10}]\n"
             "data:\n  train_images: " + images + "\n  train_labels: " + labels +
             "\n  test_images: " + images + "\n  test_labels: " + labels +
             "\n  normalize: {mean: 0.13, std: 0.31}\n  limit_train: 256\n  limit_test: 64\n"
             "optimizer: {type: adam, lr: 0.01}\n"
             "train: {steps: 50, batch_size: 16, seed: 3, log_every: 10}\n"
             "checkpoint: {every: 5, keep: 3}\n"
             "device: cpu\n");
  return path;
}

// A bench.json as another framework's script writes it: fp32 at 20 ms and fp16 at 8 ms.
std::string write_torch_bench(const ScratchDir& dir) {
  const std::string path = dir / "torch_bench.json";
  write_text(path, R"({"config": "tiny_cnn.yaml", "name": "tiny_cnn", "device": "cpu",
    "steps": 6, "warmup": 2, "rows": [
    {"framework": "torch", "precision": "fp32", "median_step_ms": 20.0, "min_step_ms": 19.0,
     "max_step_ms": 25.0, "throughput": 800.0, "throughput_unit": "samples/s",
     "torch_version": "2.4.0"},
    {"framework": "torch", "precision": "fp16", "median_step_ms": 8.0, "min_step_ms": 7.5,
     "max_step_ms": 9.0, "throughput": 2000.0, "throughput_unit": "samples/s"}]})");
  return path;
}

std::vector<nlohmann::json> step_record_list(const std::string& run_dir) {
  std::vector<nlohmann::json> steps;
  for (const nlohmann::json& r : read_jsonl(run_dir + "/metrics.jsonl")) {
    if (r["event"] == "step") steps.push_back(r);
  }
  return steps;
}

// The step times that metrics.jsonl logged (every step when log_every is 1), in ms, from
// step `first` on.
std::vector<double> logged_step_ms(const std::vector<nlohmann::json>& steps, int64_t first) {
  std::vector<double> ms;
  for (const nlohmann::json& r : steps) {
    if (r["step"].get<int64_t>() >= first) ms.push_back(r["step_ms"].get<double>());
  }
  return ms;
}

size_t data_lines(const std::string& path) {
  std::istringstream text(read_text(path));
  size_t lines = 0;
  for (std::string line; std::getline(text, line);) lines += !line.empty() && line[0] != '#';
  return lines;
}

bool is_png(const std::string& path) {
  const std::string bytes = read_text(path);
  return bytes.size() > 8 && bytes.substr(1, 3) == "PNG";
}

// The bench of the tiny config in `precisions`, `steps` steps after `warmup`, joined with
// the torch rows of write_torch_bench; config, torch rows and output all in `dir`.
mixprec::BenchOptions tiny_bench_options(const ScratchDir& dir,
                                         std::vector<std::string> precisions, int steps,
                                         int warmup) {
  mixprec::BenchOptions options;
  options.config_path = write_tiny_config(dir);
  options.precisions = std::move(precisions);
  options.steps = steps;
  options.warmup = warmup;
  options.out_dir = dir / "out";
  options.compare = {write_torch_bench(dir)};
  return options;
}

}  // namespace

TEST_CASE("bench runs fp32, fp16, bf16 and fp16-noscale side by side and joins torch rows",
          "[apps][bench]") {
  if (!mnist_present()) {
    WARN("MNIST test set not found under " << mnist_dir() << "; skipped");
    return;
  }
  ScratchDir dir("bench");
  const mixprec::BenchOptions options =
      tiny_bench_options(dir, {"fp32", "fp16", "bf16", "fp16-noscale"}, 6, 2);
  std::ostringstream log;
  const nlohmann::json bench = mixprec::run_bench(options, log);
  INFO(log.str());

  CHECK(read_json(options.out_dir + "/bench.json") == bench);
  CHECK(bench["config"] == options.config_path);
  CHECK(bench["name"] == "tiny_cnn");
  CHECK(bench["device"] == "cpu");
  CHECK(bench["tf32"] == false);
  CHECK(log.str().find("tiny_cnn on cpu with TF32 off, 6 steps") != std::string::npos);
  // A CPU bench says which path its BF16 and FP16 products took.
  CHECK(bench["cpu_bf16_products"] == mixprec::cpu::bf16_products_path());
  CHECK(bench["cpu_f16_products"] == mixprec::cpu::f16_products_path());
  CHECK(log.str().find("; BF16 products: " + mixprec::cpu::bf16_products_path() +
                       "; FP16 products: " + mixprec::cpu::f16_products_path()) !=
        std::string::npos);
  CHECK(read_json(bench["rows"][0]["run_dir"].get<std::string>() + "/summary.json")["tf32"] ==
        false);
  CHECK(bench["steps"] == 6);
  CHECK(bench["warmup"] == 2);
  const nlohmann::json& rows = bench["rows"];
  REQUIRE(rows.size() == 6);

  const double fp32_median = rows[0]["median_step_ms"].get<double>();
  mixprec::PeakMemoryProbe probe;
  probe.reset();
  const bool kernel_peak_restarts = probe.restarted();
  for (size_t i = 0; i < options.precisions.size(); ++i) {
    const nlohmann::json& row = rows[i];
    const std::string precision = options.precisions[i];
    INFO("precision " << precision << ": " << row.dump());
    for (const char* key :
         {"framework", "precision", "median_step_ms", "min_step_ms", "max_step_ms", "throughput",
          "throughput_unit", "peak_mem_mb", "final_loss", "val_loss", "val_accuracy",
          "skipped_steps", "final_scale", "host_syncs_per_step", "speedup_vs_fp32",
          "vs_mixprec_fp32", "run_dir", "note"}) {
      CHECK(row.contains(key));
    }
    CHECK(row["framework"] == "mixprec");
    CHECK(row["precision"] == precision);
    const std::string run = options.out_dir + "/" + precision;
    CHECK(row["run_dir"] == run);

    // The run is a normal run folder with the bench's settings.
    const std::string config = read_text(run + "/config.yaml");
    const std::string dtype = precision == "fp16-noscale" ? "fp16" : precision;
    CHECK(config.find("precision: " + dtype + "\n") != std::string::npos);
    CHECK(config.find("log_every: 1\n") != std::string::npos);  // max(1, 6 / 100)
    CHECK(config.find("eval_every: 0\n") != std::string::npos);
    if (precision == "fp16-noscale") CHECK(config.find("policy: none") != std::string::npos);
    CHECK(fs::exists(run + "/checkpoints/step_6"));
    CHECK_FALSE(fs::exists(run + "/checkpoints/step_5"));  // the config's every: 5 is off

    // Step times: every step is logged with its step_ms, the same clock the bench reads;
    // the statistics cover steps 3..6.
    const std::vector<nlohmann::json> steps = step_record_list(run);
    REQUIRE(steps.size() == 6);
    const std::vector<double> timed = logged_step_ms(steps, 3);
    REQUIRE(timed.size() == 4);
    const double median = row["median_step_ms"].get<double>();
    CHECK(median == Approx(mixprec::median_of(timed)).epsilon(1e-12));
    CHECK(row["min_step_ms"].get<double>() ==
          Approx(*std::min_element(timed.begin(), timed.end())).epsilon(1e-12));
    CHECK(row["max_step_ms"].get<double>() ==
          Approx(*std::max_element(timed.begin(), timed.end())).epsilon(1e-12));
    CHECK(row["min_step_ms"].get<double>() <= median);
    CHECK(median <= row["max_step_ms"].get<double>());
    CHECK(row["throughput_unit"] == "samples/s");
    CHECK(row["throughput"].get<double>() == Approx(16.0 / (median / 1000.0)));
    CHECK(row["peak_mem_mb"].get<double>() > 0.0);
    // 6 steps > warmup 2: nothing to say, unless the kernel's peak cannot be restarted here.
    if (kernel_peak_restarts) {
      CHECK(row["note"] == "");
    } else {
      CHECK(row["note"].get<std::string>().find("process peak") != std::string::npos);
    }

    // Losses, evaluation and scaling are the run's own.
    const nlohmann::json summary = read_json(run + "/summary.json");
    CHECK(row["final_loss"] == summary["train_loss"]);
    CHECK(row["val_loss"] == summary["val_loss"]);
    CHECK(row["val_accuracy"] == summary["val_accuracy"]);
    CHECK(row["skipped_steps"] == summary["skipped_steps"]);
    CHECK(row["final_scale"] == summary["final_scale"]);
    CHECK(row["host_syncs_per_step"].is_null());
    int64_t skipped = 0;
    for (const nlohmann::json& r : steps) skipped += r["skipped"].get<bool>();
    CHECK(row["skipped_steps"] == skipped);
    if (precision == "fp16") {
      // Dynamic scaling from 2^16 and no growth within 6 steps: each skip halved it.
      CHECK(row["final_scale"].get<double>() == std::ldexp(65536.0, -static_cast<int>(skipped)));
    } else {
      CHECK(row["final_scale"] == 1.0);
    }

    // fp32's median over this row's.
    const double speedup = row["speedup_vs_fp32"].get<double>();
    CHECK(speedup > 0.0);
    CHECK(speedup == Approx(fp32_median / median).epsilon(1e-12));
    CHECK(row["vs_mixprec_fp32"].get<double>() == Approx(speedup).epsilon(1e-12));

    // The loss curve holds every logged step with a finite loss.
    size_t finite = 0;
    for (const nlohmann::json& r : steps) finite += r["loss"].is_number();
    CHECK(data_lines(options.out_dir + "/loss_" + precision + ".dat") == finite);
  }
  CHECK(rows[0]["speedup_vs_fp32"] == 1.0);

  // torch's rows keep their keys; speedups against torch's fp32 (20 ms) and ours.
  CHECK(rows[4]["framework"] == "torch");
  CHECK(rows[4]["torch_version"] == "2.4.0");
  CHECK(rows[4]["speedup_vs_fp32"] == 1.0);
  CHECK(rows[5]["speedup_vs_fp32"].get<double>() == Approx(2.5));
  CHECK(rows[4]["vs_mixprec_fp32"].get<double>() == Approx(fp32_median / 20.0));
  CHECK(rows[5]["vs_mixprec_fp32"].get<double>() == Approx(fp32_median / 8.0));

  // Only fp16 scales its loss: its scale curve has every step, the others have none.
  CHECK(data_lines(options.out_dir + "/scale_fp16.dat") == 6);
  for (const char* precision : {"fp32", "bf16", "fp16-noscale"}) {
    CHECK_FALSE(fs::exists(options.out_dir + "/scale_" + precision + ".dat"));
  }
  if (mixprec::gnuplot_available()) {
    CHECK(is_png(options.out_dir + "/loss.png"));
    CHECK(is_png(options.out_dir + "/scale.png"));
  } else {
    WARN("gnuplot is not installed: charts not checked");
  }

  const std::string markdown = read_text(options.out_dir + "/bench.md");
  CHECK(markdown.find("| mixprec | fp16-noscale |") != std::string::npos);
  CHECK(markdown.find("| torch | fp16 |") != std::string::npos);
  CHECK(markdown.find("mixprec bench " + options.config_path) != std::string::npos);
  CHECK(markdown.find("--set precision=bf16") != std::string::npos);

  // The log ends with the terminal table.
  const std::string table = mixprec::bench_table(bench);
  CHECK(log.str().size() >= table.size());
  CHECK(log.str().substr(log.str().size() - table.size()) == table);
  CHECK(table.find("fp16-noscale") != std::string::npos);
  CHECK(table.find("torch") != std::string::npos);
}

TEST_CASE("bench without fp32 and with fewer steps than warmup says so", "[apps][bench]") {
  if (!mnist_present()) {
    WARN("MNIST test set not found; skipped");
    return;
  }
  ScratchDir dir("bench-short");
  const mixprec::BenchOptions options = tiny_bench_options(dir, {"bf16", "fp16-noscale"}, 2, 5);
  std::ostringstream log;
  const nlohmann::json bench = mixprec::run_bench(options, log);
  INFO(log.str());
  const nlohmann::json& rows = bench["rows"];
  REQUIRE(rows.size() == 4);
  for (size_t i = 0; i < 2; ++i) {
    INFO(rows[i].dump());
    CHECK(rows[i]["speedup_vs_fp32"].is_null());
    CHECK(rows[i]["vs_mixprec_fp32"].is_null());
    CHECK(rows[i]["note"].get<std::string>().find("warmup") != std::string::npos);
    // Both steps are timed.
    const std::vector<double> timed =
        logged_step_ms(step_record_list(rows[i]["run_dir"].get<std::string>()), 1);
    REQUIRE(timed.size() == 2);
    CHECK(rows[i]["median_step_ms"].get<double>() == Approx(mixprec::median_of(timed)));
  }
  CHECK(rows[3]["speedup_vs_fp32"].get<double>() == Approx(2.5));  // torch's own fp32
  CHECK(rows[3]["vs_mixprec_fp32"].is_null());
  // Neither precision scales its loss.
  CHECK_FALSE(fs::exists(options.out_dir + "/scale.png"));
  CHECK(log.str().find("scale.png not drawn") != std::string::npos);
}

TEST_CASE("bench keeps a train.log_every given with --set", "[apps][bench]") {
  if (!mnist_present()) {
    WARN("MNIST test set not found; skipped");
    return;
  }
  ScratchDir dir("bench-log-every");
  mixprec::BenchOptions options = tiny_bench_options(dir, {"fp32"}, 6, 2);
  options.overrides = {" train.log_every =3"};  // as the config loader reads it
  std::ostringstream log;
  const nlohmann::json bench = mixprec::run_bench(options, log);
  INFO(log.str());
  const std::string run = bench["rows"][0]["run_dir"].get<std::string>();
  CHECK(read_text(run + "/config.yaml").find("log_every: 3\n") != std::string::npos);
  // The step times still cover every step after the warmup: steps 3 to 6.
  CHECK(bench["rows"][0]["note"] == "");
  CHECK(bench["rows"][0]["median_step_ms"].get<double>() > 0.0);
}

TEST_CASE("bench refuses bad input before any run folder appears", "[apps][bench]") {
  if (!mnist_present()) {
    WARN("MNIST test set not found; skipped");
    return;
  }
  ScratchDir dir("bench-bad");
  const std::string config = write_tiny_config(dir);
  const std::string not_json = dir / "not_json.json";
  write_text(not_json, "precision,median\nfp32,12\n");
  const std::string no_rows = dir / "no_rows.json";
  write_text(no_rows, R"({"name": "tiny_cnn", "rows": []})");
  const std::string bad_row = dir / "bad_row.json";
  write_text(bad_row, R"({"rows": [{"framework": "torch", "precision": "fp32"}]})");

  struct BadCase {
    const char* what;
    std::vector<std::string> precisions;
    std::vector<std::string> compare;
    std::vector<std::string> overrides;
    std::vector<std::string> needles;
  };
  const std::vector<BadCase> cases{
      {"unknown precision", {"fp32", "fp8"}, {}, {}, {"fp8", "fp16-noscale"}},
      {"repeated precision", {"fp16", "fp16"}, {}, {}, {"fp16", "twice"}},
      {"no precision", {}, {}, {}, {"--precisions"}},
      {"compare file not JSON", {"fp32"}, {not_json}, {}, {not_json, "not JSON"}},
      {"compare file without rows", {"fp32"}, {no_rows}, {}, {no_rows, "rows"}},
      {"compare row without a time", {"fp32"}, {bad_row}, {}, {bad_row, "median_step_ms"}},
      {"missing compare file", {"fp32"}, {dir / "nowhere.json"}, {}, {"nowhere.json"}},
      {"a config that does not load", {"fp32", "bf16"}, {}, {"train.batch_size=0"},
       {"train.batch_size", ">= 1"}},
  };
  for (const BadCase& c : cases) {
    INFO(c.what);
    mixprec::BenchOptions options;
    options.config_path = config;
    options.precisions = c.precisions;
    options.compare = c.compare;
    options.overrides = c.overrides;
    options.steps = 2;
    options.out_dir = dir / "out";
    std::ostringstream log;
    try {
      mixprec::run_bench(options, log);
      FAIL("no error");
    } catch (const mixprec::Error& e) {
      const std::string message = e.what();
      INFO(message);
      for (const std::string& needle : c.needles) CHECK(message.find(needle) != std::string::npos);
    }
    CHECK_FALSE(fs::exists(options.out_dir));
  }

  // A folder that already holds a bench is left as it was.
  fs::create_directories(dir / "done");
  write_text(dir / "done/bench.json", "{}");
  mixprec::BenchOptions options;
  options.config_path = config;
  options.precisions = {"fp32"};
  options.steps = 2;
  options.out_dir = dir / "done";
  std::ostringstream log;
  CHECK_THROWS_WITH(mixprec::run_bench(options, log), Catch::Contains("already holds a bench"));
  CHECK_FALSE(fs::exists(dir / "done/fp32"));
  CHECK(read_text(dir / "done/bench.json") == "{}");
}
