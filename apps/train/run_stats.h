// Running statistics of a training run: step times and losses, for the log lines, the
// progress bar and summary.json.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace mixprec {

class RunStats {
 public:
  // One finished step: its wall time and its loss (non-finite losses are timed but left out
  // of every loss average).
  void record(double seconds, double loss) {
    record_time(seconds);
    record_loss(loss);
  }
  // The two halves of record(), for a loop that reads its losses from the device only now
  // and then: times every step, losses in step order when they are read.
  void record_time(double seconds);
  void record_loss(double loss);

  // Median wall time of the last 50 steps (what the bar and log lines show), 0 before any.
  double recent_step_seconds() const;
  // Median over the whole run, leaving out the first step (allocation and warm-up) when
  // there are others; 0 before any.
  double median_step_seconds() const;
  // Mean loss of the steps since the previous call (the log line's train_loss); empty when
  // none had a finite loss. Starts the next window.
  std::optional<double> take_window_loss();
  // Mean of the last 50 finite losses (summary.json's train_loss).
  std::optional<double> recent_loss() const;
  // Those losses, oldest first, for a checkpoint; and the same given back on resume, before
  // any step is recorded (at most the last kRecent are kept).
  std::vector<double> recent_losses() const;
  void restore_recent_losses(const std::vector<double>& losses);

  static constexpr size_t kRecent = 50;

 private:
  std::vector<double> step_seconds_;
  std::deque<double> recent_seconds_;
  std::deque<double> recent_losses_;
  double window_loss_ = 0.0;
  int64_t window_steps_ = 0;
};

double median_of(std::vector<double> values);  // 0 for none

}  // namespace mixprec
