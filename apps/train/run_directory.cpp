#include "apps/train/run_directory.h"

#include <ctime>
#include <filesystem>
#include <sstream>
#include <vector>

#include "apps/checkpoint/atomic_file.h"
#include "core/error.h"

namespace mixprec {

namespace fs = std::filesystem;

std::string default_run_dir(const std::string& name) {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &local);
  const std::string base = "runs/" + (name.empty() ? std::string("run") : name) + "-" + stamp;
  std::string dir = base;
  for (int n = 2; fs::exists(dir); ++n) dir = base + "-" + std::to_string(n);
  return dir;
}

void require_fresh_run_dir(const std::string& dir) {
  for (const char* entry : {"config.yaml", "metrics.jsonl", "checkpoints"}) {
    MIXPREC_CHECK(!fs::exists(fs::path(dir) / entry), "'", dir,
                  "' already holds a run (it has ", entry,
                  "); continue it with --resume ", dir, " or choose another --out");
  }
}

MetricsLog::MetricsLog(const std::string& dir, int64_t keep_until_step)
    : path_((fs::path(dir) / "metrics.jsonl").string()) {
  if (keep_until_step >= 0 && fs::exists(path_)) {
    std::ifstream in(path_);
    std::vector<std::string> kept;
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
      // A line cut short by a crash is not valid JSON: drop it with the later steps.
      if (record.is_discarded()) continue;
      if (record.contains("step") && record["step"].is_number_integer() &&
          record["step"].get<int64_t>() > keep_until_step) {
        continue;
      }
      kept.push_back(line);
      kept_records_.push_back(record);
    }
    std::string text;
    for (const std::string& line : kept) text += line + "\n";
    write_file_atomic(path_, text.data(), text.size());
  }
  out_.open(path_, std::ios::app);
  MIXPREC_CHECK(out_.good(), "cannot open '", path_, "' for writing");
}

void MetricsLog::write(const nlohmann::json& record) {
  if (path_.empty()) return;
  out_ << record.dump() << "\n";
  out_.flush();
  MIXPREC_CHECK(out_.good(), "writing '", path_, "' failed (disk full?)");
}

}  // namespace mixprec
