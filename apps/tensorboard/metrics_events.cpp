#include "apps/tensorboard/metrics_events.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

namespace mixprec::tensorboard {

namespace {

struct TagOf {
  const char* event;  // the record's "event"
  const char* key;
  const char* tag;
};

constexpr TagOf kTags[] = {
    {"step", "train_loss", "loss/train"},
    {"step", "lr", "optim/lr"},
    {"step", "grad_norm", "optim/grad_norm"},
    {"step", "scale", "amp/scale"},
    {"step", "skipped_steps", "amp/skipped"},
    {"step", "step_ms", "perf/step_ms"},
    {"step", "samples_per_s", "perf/samples_per_s"},
    {"step", "tokens_per_s", "perf/tokens_per_s"},
    {"step", "host_syncs_per_step", "perf/host_syncs_per_step"},
    {"eval", "val_loss", "loss/val"},
    {"eval", "val_accuracy", "accuracy/val"},
};

std::optional<int64_t> step_of(const nlohmann::json& record) {
  const auto step = record.find("step");
  if (step == record.end() || !step->is_number_integer()) return std::nullopt;
  return step->get<int64_t>();
}

}  // namespace

std::vector<Scalar> metrics_scalars(const nlohmann::json& record) {
  std::vector<Scalar> scalars;
  const auto event = record.find("event");
  if (event == record.end() || !event->is_string()) return scalars;
  for (const TagOf& entry : kTags) {
    if (*event != entry.event) continue;
    const auto value = record.find(entry.key);
    // metrics.jsonl writes a non-finite number as a string ("inf"); a chart has no point
    // for it, and the record keeps it.
    if (value == record.end() || !value->is_number()) continue;
    const double number = value->get<double>();
    if (std::isfinite(number)) scalars.push_back({entry.tag, number});
  }
  return scalars;
}

MetricsEventLog::MetricsEventLog(const std::string& run_dir) : file_(run_dir) {
  file_.write_session_start(1);
}

MetricsEventLog::MetricsEventLog(const std::string& run_dir, int64_t first_step,
                                 const std::vector<nlohmann::json>& kept)
    : file_(run_dir) {
  std::map<std::string, int64_t> last_step;  // of each tag among the kept records
  for (const nlohmann::json& record : kept) {
    const std::optional<int64_t> step = step_of(record);
    if (!step) continue;
    for (const Scalar& scalar : metrics_scalars(record)) last_step[scalar.tag] = *step;
  }
  if (last_step.empty()) {
    file_.write_session_start(first_step);
    return;
  }
  int64_t from = last_step.begin()->second;
  for (const auto& [tag, step] : last_step) from = std::min(from, step);
  file_.write_session_start(from);
  for (const nlohmann::json& record : kept) {
    if (step_of(record).value_or(from - 1) >= from) write(record);
  }
}

void MetricsEventLog::write(const nlohmann::json& record) {
  if (const std::optional<int64_t> step = step_of(record))
    file_.write_scalars(*step, metrics_scalars(record));
}

}  // namespace mixprec::tensorboard
