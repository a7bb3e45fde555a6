// The figures of bench.json's rows that are computed rather than copied: step-time
// statistics, the rows read from --compare files, and the speedup columns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mixprec {

struct StepTimeStats {
  double median_ms = 0.0;
  double min_ms = 0.0;
  double max_ms = 0.0;
  int64_t timed_steps = 0;  // how many steps the figures cover
  bool warmup_kept = false;  // there were no more steps than `warmup`, so all were used
};

// Statistics of per-step wall times (`seconds`, in step order) over the steps after the first
// `warmup` (>= 0); over all of them when there are no more than `warmup`. All zero for none.
StepTimeStats step_time_stats(const std::vector<double>& seconds, int64_t warmup);

// The rows of a --compare file: a JSON object whose "rows" is a non-empty array of objects,
// each with a string "framework" and "precision" and either a positive "median_step_ms" or,
// for a precision that framework could not run, a string "skipped" (the reason). Each row
// gets "speedup_vs_fp32" against the fp32 row of its framework in the same file (null when
// that file has none, and for skipped rows). Throws mixprec::Error naming the file and what
// is wrong with it.
std::vector<nlohmann::json> read_compare_rows(const std::string& path);

// (reference median) / (row's median): how many times faster the row is; null when either
// is missing or not positive.
nlohmann::json speedup(const nlohmann::json& reference_median_ms, const nlohmann::json& row);

// `rows` is bench.json's array: this bench's own rows first (`own_rows` of them), then those
// of --compare files. Sets "speedup_vs_fp32" on the own rows (against the own fp32 row) and
// "vs_mixprec_fp32" on every row (against the same).
void add_speedups(nlohmann::json& rows, size_t own_rows);

}  // namespace mixprec
