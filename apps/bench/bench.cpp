// `mixprec bench`: every precision's config is opened before the first run starts, so a bad
// input costs nothing; then the runs go one after another in this process, each measured by
// the trainer's step observer, its run folder and a peak-memory probe restarted before it.
#include "apps/bench/bench.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "apps/bench/bench_charts.h"
#include "apps/bench/bench_report.h"
#include "apps/bench/bench_rows.h"
#include "apps/bench/peak_memory.h"
#include "apps/checkpoint/atomic_file.h"
#include "apps/config/train_config.h"
#include "apps/train/rank_output.h"
#include "apps/train/run_directory.h"
#include "apps/train/session.h"
#include "apps/train/trainer.h"
#include "apps/train/training_setup.h"
#include "core/cpu/bf16_dot_gemm.h"
#include "core/cpu/f16_gemm.h"
#include "core/error.h"

namespace mixprec {

namespace fs = std::filesystem;

namespace {

const std::vector<std::string>& known_precisions() {
  static const std::vector<std::string> names{"fp32", "fp16", "bf16", "fp16-noscale"};
  return names;
}

std::string joined(const std::vector<std::string>& words, const std::string& separator) {
  std::string text;
  for (const std::string& word : words) text += (text.empty() ? "" : separator) + word;
  return text;
}

// What the bench learns about a run from its config before training it.
struct PlannedRun {
  std::string precision;
  std::vector<std::string> overrides;  // complete once log_every is known
  bool scales = false;                 // its loss-scale policy is not "none"
};

struct Plan {
  std::string name;
  std::string device;
  bool cuda = false;
  bool tf32 = false;  // the config's: FP32 GEMMs and convolutions on TF32 tensor cores
  int64_t steps = 0;
  int64_t samples_per_step = 0;  // batch_size * accumulation_steps
  int64_t tokens_per_sample = 1;  // block_size for text
  bool classification = true;
  std::vector<PlannedRun> runs;
};

// The user's overrides, then the bench's for `precision` (all but train.log_every, which
// depends on the step count the config gives).
std::vector<std::string> run_overrides(const BenchOptions& options, const std::string& precision) {
  std::vector<std::string> overrides = options.overrides;
  if (precision == "fp16-noscale") {
    overrides.push_back("precision=fp16");
    overrides.push_back("loss_scale.policy=none");
  } else {
    overrides.push_back("precision=" + precision);
  }
  if (options.steps > 0) overrides.push_back("train.steps=" + std::to_string(options.steps));
  overrides.push_back("checkpoint.every=0");
  overrides.push_back("checkpoint.keep=1");
  overrides.push_back("train.eval_every=0");
  return overrides;
}

void check_options(const BenchOptions& options) {
  MIXPREC_CHECK(!options.precisions.empty(), "--precisions: give at least one of ",
                joined(known_precisions(), ", "));
  std::set<std::string> seen;
  for (const std::string& precision : options.precisions) {
    const auto& known = known_precisions();
    MIXPREC_CHECK(std::find(known.begin(), known.end(), precision) != known.end(),
                  "--precisions: unknown precision '", precision, "'; expected one of ",
                  joined(known, ", "));
    MIXPREC_CHECK(seen.insert(precision).second, "--precisions: '", precision,
                  "' is given twice; each precision runs once");
  }
  MIXPREC_CHECK(options.steps >= 0, "--steps must be >= 0 (0: the config's own length), got ",
                options.steps);
  MIXPREC_CHECK(options.warmup >= 0, "--warmup must be >= 0, got ", options.warmup);
}

// Opens every precision's session (config, data, model, device), which is everything a run
// checks before it writes, and drops it again.
Plan plan_runs(const BenchOptions& options) {
  Plan plan;
  for (const std::string& precision : options.precisions) {
    PlannedRun run;
    run.precision = precision;
    run.overrides = run_overrides(options, precision);
    try {
      const Session s = open_session(options.config_path, run.overrides);
      run.scales = make_loss_scale_policy(s.config)->kind() != "none";
      if (plan.runs.empty()) {
        plan.name = s.config.name;
        plan.device = s.device.str();
        plan.tf32 = s.config.tf32;
        plan.cuda = s.device.is_cuda();
        // Under mpirun every run has launcher_size() ranks, each with its own batch_size.
        plan.steps = total_optimizer_steps(s.config, *s.data, launcher_size());
        plan.samples_per_step =
            s.config.train.batch_size * s.config.train.accumulation_steps * launcher_size();
        plan.classification = s.data->is_classification();
        plan.tokens_per_sample = plan.classification ? 1 : s.config.model.gpt.block_size;
      }
    } catch (const Error& e) {
      MIXPREC_FAIL("bench, precision ", precision, ": ", e.what());
    }
    plan.runs.push_back(std::move(run));
  }
  // About 100 logged steps a run: enough for a loss curve, few enough that a GPU rarely waits
  // to read a loss. A train.log_every given with --set is kept: on a GPU the host reads the
  // device at log steps only, so it sets how often a short bench waits for the device.
  const bool user_log_every = overrides_set_key(options.overrides, "train.log_every");
  const int64_t log_every = std::max<int64_t>(1, plan.steps / 100);
  for (PlannedRun& run : plan.runs) {
    if (!user_log_every) run.overrides.push_back("train.log_every=" + std::to_string(log_every));
  }
  return plan;
}

// A folder that will not mix this bench's files with an earlier one's.
void require_fresh_bench_dir(const std::string& out_dir, const Plan& plan) {
  const fs::path bench_json = fs::path(out_dir) / "bench.json";
  MIXPREC_CHECK(!fs::exists(bench_json), "'", out_dir,
                "' already holds a bench (it has bench.json); choose another --out");
  for (const PlannedRun& run : plan.runs) {
    require_fresh_run_dir((fs::path(out_dir) / run.precision).string());
  }
}

// Everything one run contributes to the bench.
struct RunResult {
  nlohmann::json row;
  PrecisionCurves curves;
};

RunResult run_one(const BenchOptions& options, const Plan& plan, const PlannedRun& run,
                  const std::string& run_dir, std::ostream& log) {
  PeakMemoryProbe probe(plan.cuda);
  std::vector<double> step_seconds;
  RunResult result;
  result.curves.precision = run.precision;
  result.curves.scales = run.scales;

  TrainOptions train;
  train.config_path = options.config_path;
  train.overrides = run.overrides;
  train.out_dir = run_dir;
  train.on_step = [&](const StepEvent& event) {
    step_seconds.push_back(event.seconds);
    result.curves.scale.push_back({event.step, event.scale, event.skipped});
  };
  probe.reset();
  nlohmann::json summary;
  try {
    summary = run_training(train, log);
  } catch (const Error& e) {
    MIXPREC_FAIL("bench, precision ", run.precision, ": ", e.what());
  }
  const PeakMemory peak = probe.peak();
  // Rank 0 alone writes metrics.jsonl (and the bench's files).
  if (launcher_rank() == 0)
    result.curves.loss = read_loss_points((fs::path(run_dir) / "metrics.jsonl").string());

  const StepTimeStats times = step_time_stats(step_seconds, options.warmup);
  std::vector<std::string> notes;
  if (times.warmup_kept) {
    notes.push_back("only " + std::to_string(step_seconds.size()) +
                    " steps, not more than the warmup of " + std::to_string(options.warmup) +
                    ": the step times cover all of them");
  }
  if (!peak.note.empty()) notes.push_back(peak.note);
  const double median_s = times.median_ms / 1000.0;
  const double per_step = static_cast<double>(plan.samples_per_step * plan.tokens_per_sample);

  nlohmann::json& row = result.row;
  row["framework"] = "mixprec";
  row["precision"] = run.precision;
  row["median_step_ms"] = times.median_ms;
  row["min_step_ms"] = times.min_ms;
  row["max_step_ms"] = times.max_ms;
  row["throughput"] = median_s > 0.0 ? per_step / median_s : 0.0;
  row["throughput_unit"] = plan.classification ? "samples/s" : "tokens/s";
  row["peak_mem_mb"] = peak.mib;
  row["final_loss"] = summary.value("train_loss", nlohmann::json(nullptr));
  row["val_loss"] = summary.value("val_loss", nlohmann::json(nullptr));
  row["val_accuracy"] = summary.value("val_accuracy", nlohmann::json(nullptr));
  row["skipped_steps"] = summary.value("skipped_steps", nlohmann::json(nullptr));
  row["final_scale"] = summary.value("final_scale", nlohmann::json(nullptr));
  row["host_syncs_per_step"] = summary.value("host_syncs_per_step", nlohmann::json(nullptr));
  row["speedup_vs_fp32"] = nullptr;  // filled once every row is known
  row["vs_mixprec_fp32"] = nullptr;
  row["run_dir"] = run_dir;
  row["note"] = joined(notes, "; ");
  return result;
}

std::vector<std::string> commands(const BenchOptions& options, const Plan& plan,
                                  const std::string& out_dir) {
  std::vector<std::string> bench{"mixprec", "bench", options.config_path, "--precisions",
                                 joined(options.precisions, ",")};
  if (options.steps > 0) bench.insert(bench.end(), {"--steps", std::to_string(options.steps)});
  bench.insert(bench.end(), {"--warmup", std::to_string(options.warmup), "--out", out_dir});
  for (const std::string& o : options.overrides) bench.insert(bench.end(), {"--set", o});
  for (const std::string& c : options.compare) bench.insert(bench.end(), {"--compare", c});
  std::vector<std::string> lines{"# this bench", shell_command(bench),
                                 "# each run alone, into a new run folder of its own"};
  for (const PlannedRun& run : plan.runs) {
    std::vector<std::string> train{"mixprec", "train", options.config_path};
    for (const std::string& o : run.overrides) train.insert(train.end(), {"--set", o});
    lines.push_back(shell_command(train));
  }
  return lines;
}

void write_text(const std::string& path, const std::string& text) {
  write_file_atomic(path, text.data(), text.size());
}

}  // namespace

nlohmann::json run_bench(const BenchOptions& options, std::ostream& log) {
  check_options(options);
  std::vector<nlohmann::json> compare_rows;
  for (const std::string& path : options.compare) {
    const std::vector<nlohmann::json> rows = read_compare_rows(path);
    compare_rows.insert(compare_rows.end(), rows.begin(), rows.end());
  }
  const Plan plan = plan_runs(options);
  const std::string out_dir =
      !options.out_dir.empty() ? options.out_dir : default_run_dir(plan.name + "-bench");
  // Under mpirun rank 0 writes the bench folder; the runs take its run folders' names from
  // rank 0 too (the trainer's), so the other ranks' `out_dir` names nothing they write.
  const bool writes = launcher_rank() == 0;
  if (writes) require_fresh_bench_dir(out_dir, plan);

  // Everything is checked; from here on the bench folder is written.
  std::error_code fs_error;
  if (writes) fs::create_directories(out_dir, fs_error);
  MIXPREC_CHECK(!writes || (!fs_error && fs::is_directory(out_dir, fs_error)),
                "cannot create the bench folder '", out_dir, "': ",
                fs_error ? fs_error.message() : "a file of that name exists");

  nlohmann::json rows = nlohmann::json::array();
  std::vector<PrecisionCurves> curves;
  for (size_t i = 0; i < plan.runs.size(); ++i) {
    const PlannedRun& run = plan.runs[i];
    const std::string run_dir = (fs::path(out_dir) / run.precision).string();
    log << "bench: " << run.precision << " (" << i + 1 << "/" << plan.runs.size() << "), "
        << plan.steps << " steps into " << run_dir << "\n";
    RunResult result = run_one(options, plan, run, run_dir, log);
    log << "bench: " << run.precision << ": median step "
        << result.row["median_step_ms"].get<double>() << " ms, peak memory "
        << result.row["peak_mem_mb"].get<double>() << " MiB\n";
    rows.push_back(std::move(result.row));
    curves.push_back(std::move(result.curves));
  }
  const size_t own_rows = rows.size();
  for (nlohmann::json& row : compare_rows) rows.push_back(std::move(row));
  add_speedups(rows, own_rows);

  nlohmann::json bench{{"config", options.config_path},
                       {"name", plan.name},
                       {"device", plan.device},
                       {"tf32", plan.tf32},
                       {"steps", plan.steps},
                       {"warmup", options.warmup},
                       {"overrides", options.overrides},
                       {"rows", rows}};
  if (plan.device == "cpu") {
    bench["cpu_bf16_products"] = cpu::bf16_products_path();
    bench["cpu_f16_products"] = cpu::f16_products_path();
  }
  if (launcher_size() > 1) bench["ranks"] = launcher_size();
  if (!writes) return bench;
  const std::vector<std::string> charts = draw_bench_charts(out_dir, plan.name, curves, log);
  write_text((fs::path(out_dir) / "bench.json").string(), bench.dump(2) + "\n");
  write_text((fs::path(out_dir) / "bench.md").string(),
             bench_markdown(bench, charts, commands(options, plan, out_dir)));
  log << "bench: wrote " << (fs::path(out_dir) / "bench.json").string() << " and bench.md\n"
      << bench_table(bench);
  return bench;
}

}  // namespace mixprec
