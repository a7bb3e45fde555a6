#include "dist/watchdog.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>

#include "core/error.h"

namespace mixprec::dist {
namespace {

// Longer limits are as good as none; capping them keeps the deadline inside the clock's range.
constexpr double kLongestTimeoutS = 1e7;

double checked_timeout(double timeout_s) {
  MIXPREC_CHECK(std::isfinite(timeout_s) && timeout_s > 0,
                "collective watchdog: the timeout must be a positive number of seconds, got ",
                timeout_s);
  return timeout_s;
}

}  // namespace

std::string timeout_line(int rank, std::string_view op, int64_t sequence, int64_t step,
                         double timeout_s) {
  std::ostringstream line;
  line << "rank " << rank << ": collective " << op << " #" << sequence << " at step " << step
       << " did not finish within " << timeout_s << " s; aborting every rank";
  return line.str();
}

Watchdog::Watchdog(int rank, double timeout_s, OnTimeout on_timeout)
    : rank_(rank),
      timeout_s_(checked_timeout(timeout_s)),
      timeout_(std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(std::min(timeout_s_, kLongestTimeoutS)))),
      on_timeout_(std::move(on_timeout)) {
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_one();
  thread_.join();
}

Watchdog::Watch Watchdog::watch(std::string_view op, int64_t step) {
  std::lock_guard lock(mutex_);
  MIXPREC_CHECK(!open_, "collective ", op, " started while collective ", op_, " #", sequence_,
                " is still running: the collectives of one communicator run one at a time");
  open_ = true;
  reported_ = false;
  op_ = op;
  step_ = step;
  started_ = Clock::now();
  const int64_t sequence = ++sequence_;
  changed_.notify_one();
  return Watch(*this, sequence);
}

Watchdog::Watch::~Watch() { dog_.finish(sequence_); }

void Watchdog::finish(int64_t sequence) {
  std::lock_guard lock(mutex_);
  if (sequence == sequence_) open_ = false;
  changed_.notify_one();
}

void Watchdog::run() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    if (!open_ || reported_) {
      changed_.wait(lock);
      continue;
    }
    const Clock::time_point deadline = started_ + timeout_;
    if (Clock::now() < deadline) {
      changed_.wait_until(lock, deadline);
      continue;
    }
    reported_ = true;
    const std::string line = timeout_line(rank_, op_, sequence_, step_, timeout_s_);
    // The action need not return (MPI_Abort); the lock is not held while it runs.
    lock.unlock();
    on_timeout_(line);
    lock.lock();
  }
}

}  // namespace mixprec::dist
