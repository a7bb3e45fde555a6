// The numbers behind log lines and summary.json: medians that skip the warm-up step, loss
// windows, and losses that were not finite.
#include <catch2/catch.hpp>

#include <limits>

#include "apps/train/run_stats.h"

using mixprec::RunStats;

TEST_CASE("RunStats: medians leave out the first step and follow the last 50", "[apps][stats]") {
  RunStats stats;
  CHECK(stats.median_step_seconds() == 0.0);
  stats.record(10.0, 2.0);  // a slow first step
  CHECK(stats.median_step_seconds() == 10.0);  // alone, it is all there is
  stats.record(1.0, 2.0);
  stats.record(3.0, 2.0);
  // Without the first step: median of {1, 3} = 2; the recent median still sees it: {10, 1, 3}.
  CHECK(stats.median_step_seconds() == 2.0);
  CHECK(stats.recent_step_seconds() == 3.0);
  for (int i = 0; i < 50; ++i) stats.record(0.5, 2.0);
  CHECK(stats.recent_step_seconds() == 0.5);  // the old steps left the window
  CHECK(stats.median_step_seconds() == 0.5);
}

TEST_CASE("RunStats: loss windows and non-finite losses", "[apps][stats]") {
  RunStats stats;
  CHECK_FALSE(stats.take_window_loss().has_value());
  CHECK_FALSE(stats.recent_loss().has_value());
  stats.record(1.0, 1.0);
  stats.record(1.0, std::numeric_limits<double>::infinity());  // a skipped step's loss
  stats.record(1.0, 3.0);
  CHECK(stats.take_window_loss() == Approx(2.0));
  CHECK_FALSE(stats.take_window_loss().has_value());  // the window restarted
  stats.record(1.0, 5.0);
  CHECK(stats.take_window_loss() == Approx(5.0));
  CHECK(stats.recent_loss() == Approx(3.0));  // mean of 1, 3, 5
  for (int i = 0; i < 50; ++i) stats.record(1.0, 0.25);
  CHECK(stats.recent_loss() == Approx(0.25));  // only the last 50
}

TEST_CASE("RunStats: the recent losses go into a checkpoint and come back on resume",
          "[apps][stats]") {
  RunStats before;
  for (int i = 1; i <= 60; ++i) before.record(1.0, static_cast<double>(i));
  const std::vector<double> saved = before.recent_losses();
  REQUIRE(saved.size() == RunStats::kRecent);
  CHECK(saved.front() == 11.0);  // oldest first: steps 11..60
  CHECK(saved.back() == 60.0);

  RunStats resumed;
  resumed.restore_recent_losses(saved);
  CHECK(resumed.recent_loss() == before.recent_loss());
  for (int i = 61; i <= 70; ++i) {
    before.record(1.0, static_cast<double>(i));
    resumed.record(1.0, static_cast<double>(i));
  }
  CHECK(resumed.recent_loss() == before.recent_loss());  // mean of 21..70
  CHECK(resumed.recent_loss() == Approx(45.5));
  // The log line's window starts empty after a resume, and a list longer than the window
  // keeps its last kRecent values.
  CHECK(resumed.take_window_loss() == Approx(65.5));
  std::vector<double> long_list(80, 1.0);
  long_list.back() = 51.0;
  resumed.restore_recent_losses(long_list);
  CHECK(resumed.recent_losses().size() == RunStats::kRecent);
  CHECK(resumed.recent_loss() == Approx(2.0));  // (49 + 51) / 50
}
