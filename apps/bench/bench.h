// `mixprec bench` as a library call: the same model, data, seed and step count trained once
// per precision, in one process, and reported side by side.
//
// Each precision is one run_training() call into <out>/<precision>/ (a normal run folder),
// with the user's overrides followed by the bench's own: `precision=<p>` (fp16-noscale is
// precision=fp16 with loss_scale.policy=none), `train.steps=<steps>` when given,
// `checkpoint.every=0`, `checkpoint.keep=1`, `train.eval_every=0` (the trainer evaluates
// once, at the end) and `train.log_every=<max(1, steps / 100)>`, so each loss curve has
// about 100 points while a GPU reads its loss only at those steps.
//
// <out>/ then holds:
// - bench.json: {"config", "name", "device", "tf32" (the config's), "steps", "warmup",
//   "overrides", "rows"}. One
//   row per precision, in the order asked: "framework" ("mixprec"), "precision",
//   "median_step_ms", "min_step_ms", "max_step_ms" (over the steps after `warmup`; all steps
//   when there are no more than `warmup`, which "note" says), "throughput" and
//   "throughput_unit" ("samples/s" or "tokens/s", from the median), "peak_mem_mb" (MiB: the
//   host's resident-set peak during that run on the CPU, the caching allocator's peak bytes
//   in use on a CUDA device), "final_loss" (summary.json's train_loss: the mean loss of the
//   last 50 steps), "val_loss", "val_accuracy" (null for text), "skipped_steps",
//   "final_scale", "host_syncs_per_step" (null on the CPU), "speedup_vs_fp32" (the fp32
//   row's median / this median; null without an fp32 row), "vs_mixprec_fp32" (the same
//   ratio against mixprec's fp32 row), "run_dir" and "note" (empty unless a figure needs a
//   caveat). Rows of --compare files follow, keeping their keys, with "speedup_vs_fp32"
//   recomputed against the fp32 row of the same framework in the same file and
//   "vs_mixprec_fp32" against mixprec's fp32 row.
// - bench.md: the same table in markdown, the charts, and the commands that reproduce it.
// - loss.png: training loss against step (left) and against training time (right), one
//   curve per precision, drawn from loss_<precision>.dat (columns: step, elapsed_s, loss).
// - scale.png: the loss scale against step for each precision whose policy scales, skipped
//   steps as points, drawn from scale_<precision>.dat (columns: step, scale, skipped 0/1);
//   not drawn when no precision scales.
// Each chart's gnuplot script (<chart>.gp) stays beside its data; without gnuplot the log
// says how to render them later.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mixprec {

struct BenchOptions {
  std::string config_path;
  std::vector<std::string> overrides;               // --set, applied to every run
  std::vector<std::string> precisions{"fp32", "fp16", "bf16"};  // also "fp16-noscale"
  int64_t steps = 0;    // 0: the config's own length
  int64_t warmup = 5;   // first steps left out of the timing statistics
  std::string out_dir;  // empty: runs/<name>-bench-<YYYYmmdd-HHMMSS>
  std::vector<std::string> compare;  // other bench.json files whose rows join the table (e.g. PyTorch's)
};

// Runs every precision and writes bench.json, bench.md, the charts and one run folder per
// precision (<out>/<precision>/, a normal training run folder). Returns bench.json's object.
// Throws mixprec::Error for bad input (unknown or repeated precision, negative steps or
// warmup, a config that does not load for one of the precisions, a --compare file that is
// not a bench.json, an out folder that already holds a bench or a run) before any training
// starts. Log lines, each run's included, and the final table go to `log`.
nlohmann::json run_bench(const BenchOptions& options, std::ostream& log);

// The terminal table of bench.json's rows, one line per row, with the rows' notes below.
std::string bench_table(const nlohmann::json& bench);

}  // namespace mixprec
