// The parts of `mixprec bench` that need no training: the peak-memory probe, the step-time
// statistics, --compare files and the speedup columns, the terminal table and the commands.
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <sstream>

#include "apps/bench/bench.h"
#include "apps/bench/bench_report.h"
#include "apps/bench/bench_rows.h"
#include "apps/bench/peak_memory.h"
#include "core/error.h"
#include "train_test_support.h"

using namespace train_test;

TEST_CASE("the peak-memory probe sees 64 MiB touched after a reset, and forgets it after the next",
          "[apps][bench]") {
  mixprec::PeakMemoryProbe probe;
  probe.reset();
  if (!probe.restarted()) {
    WARN("the kernel's high-water mark cannot be restarted here; skipped");
    return;
  }
  const double before = probe.peak().mib;
  CHECK(probe.peak().note.empty());
  constexpr size_t kBytes = size_t{64} << 20;
  {
    std::unique_ptr<char[]> block(new char[kBytes]);
    std::memset(block.get(), 1, kBytes);  // resident only once written
    volatile char sink = block[kBytes / 2];
    (void)sink;
    const double during = probe.peak().mib;
    CHECK(during - before >= 60.0);
  }
  // The block went back to the system (an allocation this large is its own mapping), so a
  // restarted peak is below what it was with the block.
  const double with_block = probe.peak().mib;
  probe.reset();
  CHECK(probe.peak().mib < with_block - 32.0);
}

TEST_CASE("step_time_stats leaves out the warmup steps unless that leaves none", "[apps][bench]") {
  const std::vector<double> seconds{0.005, 0.001, 0.003, 0.002, 0.004};
  const mixprec::StepTimeStats after_one = mixprec::step_time_stats(seconds, 1);
  // Steps 2..5: 1, 3, 2, 4 ms -> median (2 + 3) / 2.
  CHECK(after_one.median_ms == Approx(2.5));
  CHECK(after_one.min_ms == Approx(1.0));
  CHECK(after_one.max_ms == Approx(4.0));
  CHECK(after_one.timed_steps == 4);
  CHECK_FALSE(after_one.warmup_kept);

  const mixprec::StepTimeStats all = mixprec::step_time_stats(seconds, 5);
  CHECK(all.warmup_kept);
  CHECK(all.timed_steps == 5);
  CHECK(all.median_ms == Approx(3.0));
  CHECK(all.max_ms == Approx(5.0));

  const mixprec::StepTimeStats none = mixprec::step_time_stats({}, 2);
  CHECK(none.timed_steps == 0);
  CHECK(none.median_ms == 0.0);
}

TEST_CASE("compare rows get speedups against their own fp32 and against mixprec's",
          "[apps][bench]") {
  ScratchDir dir("bench-compare");
  const std::string path = dir / "other.json";
  write_text(path, R"({"rows": [
      {"framework": "torch", "precision": "fp16", "median_step_ms": 5.0},
      {"framework": "torch", "precision": "fp32", "median_step_ms": 15.0, "extra": [1, 2]},
      {"framework": "jax", "precision": "bf16", "median_step_ms": 6.0},
      {"framework": "torch", "precision": "bf16", "skipped": "no bfloat16 autocast here"}]})");
  const std::vector<nlohmann::json> compare = mixprec::read_compare_rows(path);
  REQUIRE(compare.size() == 4);
  CHECK(compare[3]["speedup_vs_fp32"].is_null());  // it did not run
  CHECK(compare[0]["speedup_vs_fp32"].get<double>() == Approx(3.0));  // 15 / 5
  CHECK(compare[1]["speedup_vs_fp32"] == 1.0);
  CHECK(compare[1]["extra"] == nlohmann::json::array({1, 2}));
  CHECK(compare[2]["speedup_vs_fp32"].is_null());  // jax has no fp32 row

  nlohmann::json rows = nlohmann::json::array();
  rows.push_back({{"framework", "mixprec"}, {"precision", "fp16"}, {"median_step_ms", 4.0}});
  rows.push_back({{"framework", "mixprec"}, {"precision", "fp32"}, {"median_step_ms", 12.0}});
  for (const nlohmann::json& row : compare) rows.push_back(row);
  mixprec::add_speedups(rows, 2);
  CHECK(rows[0]["speedup_vs_fp32"].get<double>() == Approx(3.0));  // 12 / 4
  CHECK(rows[1]["speedup_vs_fp32"] == 1.0);
  CHECK(rows[0]["vs_mixprec_fp32"].get<double>() == Approx(3.0));
  CHECK(rows[2]["vs_mixprec_fp32"].get<double>() == Approx(12.0 / 5.0));
  CHECK(rows[3]["vs_mixprec_fp32"].get<double>() == Approx(12.0 / 15.0));
  CHECK(rows[4]["vs_mixprec_fp32"].get<double>() == Approx(2.0));
  CHECK(rows[2]["speedup_vs_fp32"].get<double>() == Approx(3.0));  // kept: torch's own
  CHECK(rows[5]["vs_mixprec_fp32"].is_null());

  // A row from an earlier mixprec bench keeps the speedup against its own file's fp32.
  nlohmann::json mixed = nlohmann::json::array();
  mixed.push_back({{"framework", "mixprec"}, {"precision", "fp32"}, {"median_step_ms", 10.0}});
  mixed.push_back({{"framework", "mixprec"}, {"precision", "fp16"}, {"median_step_ms", 2.0},
                   {"speedup_vs_fp32", 4.0}});
  mixprec::add_speedups(mixed, 1);
  CHECK(mixed[1]["speedup_vs_fp32"] == 4.0);
  CHECK(mixed[1]["vs_mixprec_fp32"].get<double>() == Approx(5.0));

  // Without mixprec fp32 the cross-framework column is null.
  nlohmann::json no_fp32 = nlohmann::json::array();
  no_fp32.push_back({{"framework", "mixprec"}, {"precision", "bf16"}, {"median_step_ms", 3.0}});
  mixprec::add_speedups(no_fp32, 1);
  CHECK(no_fp32[0]["speedup_vs_fp32"].is_null());
  CHECK(no_fp32[0]["vs_mixprec_fp32"].is_null());
}

TEST_CASE("bench_table aligns every row and prints nulls as dashes", "[apps][bench]") {
  const nlohmann::json bench = nlohmann::json::parse(R"({
    "name": "tiny", "device": "cpu", "steps": 10, "warmup": 2, "rows": [
    {"framework": "mixprec", "precision": "fp32", "median_step_ms": 12.3456, "min_step_ms": 11.0,
     "max_step_ms": 150.25, "throughput": 1296.03, "throughput_unit": "samples/s",
     "peak_mem_mb": 210.04, "final_loss": 0.51234, "val_loss": 0.6, "val_accuracy": 0.8125,
     "skipped_steps": 0, "final_scale": 1.0, "host_syncs_per_step": null,
     "speedup_vs_fp32": 1.0, "vs_mixprec_fp32": 1.0, "note": ""},
    {"framework": "torch", "precision": "fp16-noscale", "median_step_ms": 0.05,
     "throughput_unit": "samples/s", "final_scale": 65536.0, "speedup_vs_fp32": 2.5,
     "note": "process peak"},
    {"framework": "torch", "precision": "bf16", "skipped": "no bfloat16 autocast"},
    {"framework": "torch", "precision": "fp16", "skipped": "no bfloat16 autocast"}]})");
  const std::string table = mixprec::bench_table(bench);
  std::vector<std::string> lines;
  std::istringstream text(table);
  for (std::string line; std::getline(text, line);) lines.push_back(line);
  REQUIRE(lines.size() == 9);  // heading, header, rule, four rows, two notes
  CHECK(lines[0].find("tiny on cpu, 10 steps") != std::string::npos);  // TF32 not stated
  nlohmann::json with_tf32 = bench;
  with_tf32["tf32"] = true;
  with_tf32["device"] = "cuda:0";
  CHECK(mixprec::bench_table(with_tf32).rfind("tiny on cuda:0 with TF32 on, 10 steps", 0) == 0);
  CHECK(lines[1].find("throughput samples/s") != std::string::npos);
  CHECK(lines[1].size() == lines[2].size());
  CHECK(lines[3].size() == lines[2].size());
  CHECK(lines[4].size() == lines[2].size());
  CHECK(lines[5].size() == lines[2].size());
  CHECK(lines[3].find("12.35") != std::string::npos);   // 4 significant digits
  CHECK(lines[3].find("150.2") != std::string::npos);
  CHECK(lines[3].find("0.8125") != std::string::npos);
  CHECK(lines[3].find("1.00x") != std::string::npos);
  CHECK(lines[4].find("0.05000") != std::string::npos);
  CHECK(lines[4].find("65536") != std::string::npos);
  CHECK(lines[4].find("2.50x") != std::string::npos);
  CHECK(lines[4].find(" - ") != std::string::npos);     // missing values
  CHECK(lines[5].find("torch      bf16") == 0);
  CHECK(lines[5].find("0.") == std::string::npos);  // nothing but dashes after the names
  CHECK(lines[7] == "note: torch fp16-noscale: process peak");
  CHECK(lines[8] == "note: torch bf16, fp16: skipped: no bfloat16 autocast");  // one line
}

TEST_CASE("shell_command quotes only the words that need it", "[apps][bench]") {
  CHECK(mixprec::shell_command({"mixprec", "train", "configs/a.yaml", "--set", "precision=fp16"}) ==
        "mixprec train configs/a.yaml --set precision=fp16");
  CHECK(mixprec::shell_command({"--set", "optimizer.betas=[0.9, 0.95]", "it's", ""}) ==
        "--set 'optimizer.betas=[0.9, 0.95]' 'it'\\''s' ''");
}
