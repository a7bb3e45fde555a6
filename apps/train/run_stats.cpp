#include "apps/train/run_stats.h"

#include <algorithm>
#include <cmath>

namespace mixprec {

double median_of(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

void RunStats::record_time(double seconds) {
  step_seconds_.push_back(seconds);
  recent_seconds_.push_back(seconds);
  if (recent_seconds_.size() > kRecent) recent_seconds_.pop_front();
}

void RunStats::record_loss(double loss) {
  if (!std::isfinite(loss)) return;
  window_loss_ += loss;
  ++window_steps_;
  recent_losses_.push_back(loss);
  if (recent_losses_.size() > kRecent) recent_losses_.pop_front();
}

double RunStats::recent_step_seconds() const {
  return median_of(std::vector<double>(recent_seconds_.begin(), recent_seconds_.end()));
}

double RunStats::median_step_seconds() const {
  if (step_seconds_.size() <= 1) return median_of(step_seconds_);
  return median_of(std::vector<double>(step_seconds_.begin() + 1, step_seconds_.end()));
}

std::optional<double> RunStats::take_window_loss() {
  std::optional<double> mean;
  if (window_steps_ > 0) mean = window_loss_ / static_cast<double>(window_steps_);
  window_loss_ = 0.0;
  window_steps_ = 0;
  return mean;
}

std::optional<double> RunStats::recent_loss() const {
  if (recent_losses_.empty()) return std::nullopt;
  double sum = 0.0;
  for (double loss : recent_losses_) sum += loss;
  return sum / static_cast<double>(recent_losses_.size());
}

std::vector<double> RunStats::recent_losses() const {
  return std::vector<double>(recent_losses_.begin(), recent_losses_.end());
}

void RunStats::restore_recent_losses(const std::vector<double>& losses) {
  recent_losses_.assign(losses.begin(), losses.end());
  while (recent_losses_.size() > kRecent) recent_losses_.pop_front();
}

}  // namespace mixprec
