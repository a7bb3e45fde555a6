#include "apps/bench/bench_rows.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "apps/train/run_stats.h"
#include "core/error.h"

namespace mixprec {

namespace {

// The median of the first row of `framework` with precision fp32 among the first `count` of
// `rows`, or null.
nlohmann::json fp32_median(const nlohmann::json& rows, const std::string& framework,
                           size_t count) {
  for (size_t i = 0; i < std::min(count, rows.size()); ++i) {
    const nlohmann::json& row = rows[i];
    if (row.value("framework", "") == framework && row.value("precision", "") == "fp32") {
      return row.value("median_step_ms", nlohmann::json(nullptr));
    }
  }
  return nullptr;
}

}  // namespace

StepTimeStats step_time_stats(const std::vector<double>& seconds, int64_t warmup) {
  StepTimeStats stats;
  if (seconds.empty()) return stats;
  const size_t skip = static_cast<size_t>(std::max<int64_t>(warmup, 0));
  stats.warmup_kept = seconds.size() <= skip;
  std::vector<double> timed(stats.warmup_kept ? seconds.begin() : seconds.begin() + skip,
                            seconds.end());
  stats.timed_steps = static_cast<int64_t>(timed.size());
  const auto [low, high] = std::minmax_element(timed.begin(), timed.end());
  stats.min_ms = *low * 1000.0;
  stats.max_ms = *high * 1000.0;
  stats.median_ms = median_of(std::move(timed)) * 1000.0;
  return stats;
}

std::vector<nlohmann::json> read_compare_rows(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MIXPREC_CHECK(in.good(), "--compare ", path, ": cannot open the file");
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json bench = nlohmann::json::parse(text.str(), nullptr, false);
  MIXPREC_CHECK(!bench.is_discarded(), "--compare ", path,
                ": not JSON; expected a bench.json written by `mixprec bench` or "
                "scripts/torch_bench.py");
  MIXPREC_CHECK(bench.is_object() && bench.contains("rows") && bench["rows"].is_array() &&
                    !bench["rows"].empty(),
                "--compare ", path, ": not a bench.json (it needs a non-empty \"rows\" array)");
  std::vector<nlohmann::json> rows;
  for (size_t i = 0; i < bench["rows"].size(); ++i) {
    const nlohmann::json& row = bench["rows"][i];
    const std::string where = "--compare " + path + ": rows[" + std::to_string(i) + "]";
    MIXPREC_CHECK(row.is_object(), where, " is not an object");
    for (const char* key : {"framework", "precision"}) {
      MIXPREC_CHECK(row.contains(key) && row[key].is_string(), where, " has no string \"", key,
                    "\"");
    }
    const bool timed = row.contains("median_step_ms") && row["median_step_ms"].is_number() &&
                       row["median_step_ms"].get<double>() > 0.0;
    const bool skipped = row.contains("skipped") && row["skipped"].is_string();
    MIXPREC_CHECK(timed || skipped, where,
                  " needs a positive number \"median_step_ms\" (or a string \"skipped\" "
                  "saying why that precision did not run)");
    rows.push_back(row);
  }
  const nlohmann::json all = rows;
  for (nlohmann::json& row : rows) {
    const std::string framework = row["framework"].get<std::string>();
    row["speedup_vs_fp32"] = speedup(fp32_median(all, framework, all.size()), row);
  }
  return rows;
}

nlohmann::json speedup(const nlohmann::json& reference_median_ms, const nlohmann::json& row) {
  const nlohmann::json median = row.value("median_step_ms", nlohmann::json(nullptr));
  if (!reference_median_ms.is_number() || !median.is_number()) return nullptr;
  const double reference = reference_median_ms.get<double>(), value = median.get<double>();
  if (reference <= 0.0 || value <= 0.0) return nullptr;
  return reference / value;
}

void add_speedups(nlohmann::json& rows, size_t own_rows) {
  const nlohmann::json ours = fp32_median(rows, "mixprec", own_rows);
  for (size_t i = 0; i < rows.size(); ++i) {
    if (i < own_rows) rows[i]["speedup_vs_fp32"] = speedup(ours, rows[i]);
    rows[i]["vs_mixprec_fp32"] = speedup(ours, rows[i]);
  }
}

}  // namespace mixprec
