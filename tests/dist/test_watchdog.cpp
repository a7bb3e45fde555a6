// The collective watchdog without MPI: its action records the line instead of aborting.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dist/watchdog.h"
#include "tests/error_message.h"

using mixprec::dist::Watchdog;
using namespace std::chrono_literals;

namespace {

// The lines a watchdog reported, safe to read while its thread writes.
struct Reports {
  std::mutex mutex;
  std::vector<std::string> lines;
  Watchdog::OnTimeout action() {
    return [this](const std::string& line) {
      std::lock_guard lock(mutex);
      lines.push_back(line);
    };
  }
  std::vector<std::string> get() {
    std::lock_guard lock(mutex);
    return lines;
  }
};

}  // namespace

TEST_CASE("watchdog: a collective past the timeout is reported once, naming rank, op, seq, step",
          "[dist][watchdog]") {
  Reports reports;
  Watchdog dog(3, 0.2, reports.action());
  { const auto quick = dog.watch("barrier", 0); }
  {
    const auto slow = dog.watch("sum_in_rank_order", 41);
    CHECK(slow.sequence() == 2);
    std::this_thread::sleep_for(600ms);  // three timeouts: still one report
  }
  {
    // The next one's timeout counts from its own start.
    const auto slow_again = dog.watch("broadcast", 42);
    std::this_thread::sleep_for(350ms);
  }
  const std::vector<std::string> lines = reports.get();
  REQUIRE(lines.size() == 2);
  CHECK(lines[0] ==
        "rank 3: collective sum_in_rank_order #2 at step 41 did not finish within 0.2 s; "
        "aborting every rank");
  CHECK(lines[1] == mixprec::dist::timeout_line(3, "broadcast", 3, 42, 0.2));
}

TEST_CASE("watchdog: collectives that finish in time are never reported", "[dist][watchdog]") {
  Reports reports;
  Watchdog dog(0, 0.3, reports.action());
  for (int i = 0; i < 5; ++i) {
    const auto watch = dog.watch("max", i);
    std::this_thread::sleep_for(100ms);  // 500 ms in all, each watch well within 300 ms
  }
  std::this_thread::sleep_for(400ms);  // no watch open: nothing may fire
  CHECK(reports.get().empty());
}

TEST_CASE("watchdog: overlapping collectives and bad timeouts are errors", "[dist][watchdog]") {
  Reports reports;
  Watchdog dog(0, 10.0, reports.action());
  const auto open = dog.watch("barrier", 2);
  CHECK(mixprec_test::error_message([&] { (void)dog.watch("max", 2); }) ==
        "collective max started while collective barrier #1 is still running: the collectives "
        "of one communicator run one at a time");
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::quiet_NaN()}) {
    CHECK_THROWS_WITH(Watchdog(0, bad, reports.action()),
                      Catch::StartsWith("collective watchdog: the timeout must be a positive"));
  }
}
