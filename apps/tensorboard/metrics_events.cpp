#include "apps/tensorboard/metrics_events.h"

#include <cmath>

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

MetricsEventLog::MetricsEventLog(const std::string& run_dir, int64_t first_step)
    : file_(run_dir) {
  file_.write_session_start(first_step);
}

void MetricsEventLog::write(const nlohmann::json& record) {
  const auto step = record.find("step");
  if (step == record.end() || !step->is_number_integer()) return;
  file_.write_scalars(step->get<int64_t>(), metrics_scalars(record));
}

}  // namespace mixprec::tensorboard
