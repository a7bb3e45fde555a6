// The files of a run directory other than checkpoints: config.yaml, metrics.jsonl and
// summary.json.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mixprec {

// "runs/<name>-<YYYYmmdd-HHMMSS>" (local time), with "-2", "-3", ... appended while taken.
std::string default_run_dir(const std::string& name);

// Throws mixprec::Error when `dir` already holds a run (config.yaml, metrics.jsonl or
// checkpoints/), so a fresh run never writes over an earlier one.
void require_fresh_run_dir(const std::string& dir);

// Appends one JSON object per line and flushes it, so a crash loses at most the line being
// written.
class MetricsLog {
 public:
  // Opens <dir>/metrics.jsonl for appending. With `keep_until_step` >= 0 (a resume), first
  // drops the lines of steps after it, which the resumed run writes again.
  MetricsLog(const std::string& dir, int64_t keep_until_step);
  // A log that writes nothing: the ranks other than 0 of a data-parallel run.
  MetricsLog() = default;
  void write(const nlohmann::json& record);
  // On a resume, the records of the lines kept, in file order; empty otherwise.
  const std::vector<nlohmann::json>& kept_records() const { return kept_records_; }

 private:
  std::string path_;
  std::ofstream out_;
  std::vector<nlohmann::json> kept_records_;
};

}  // namespace mixprec
