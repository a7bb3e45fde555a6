// The collective watchdog: a collective that has not finished within the timeout ends the run.
//
// A rank that never reaches a collective (it crashed, hangs, or took another branch) leaves the
// others waiting in it forever; the watchdog turns that into a one-line diagnosis and an exit.
// One background thread watches one collective at a time: a collective calls watch() on entry
// and the returned Watch ends the watch when it goes out of scope. When a watch has lasted
// longer than the timeout, the thread calls `on_timeout` once with the line
//   rank R: collective <op> #<seq> at step <S> did not finish within <T> s; aborting every rank
// (without a newline). The MPI communicator's action prints it to stderr and calls MPI_Abort;
// a test passes an action that records it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

namespace mixprec::dist {

// The line of a collective that timed out (see above).
std::string timeout_line(int rank, std::string_view op, int64_t sequence, int64_t step,
                         double timeout_s);

class Watchdog {
 public:
  using OnTimeout = std::function<void(const std::string& line)>;

  // Starts the thread. `timeout_s` must be a positive number (throws mixprec::Error).
  Watchdog(int rank, double timeout_s, OnTimeout on_timeout);
  // Stops and joins the thread; a watch still open is dropped.
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Open while it lives; returned from watch() only.
  class Watch {
   public:
    ~Watch();
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;
    int64_t sequence() const { return sequence_; }

   private:
    friend class Watchdog;
    Watch(Watchdog& dog, int64_t sequence) : dog_(dog), sequence_(sequence) {}
    Watchdog& dog_;
    int64_t sequence_;
  };

  // Starts watching collective `op` of training step `step`; its sequence number is one more
  // than the previous watch's (the first is 1). Collectives of one communicator run one after
  // another, so a watch opened while another is open throws mixprec::Error.
  [[nodiscard]] Watch watch(std::string_view op, int64_t step);

  double timeout_s() const { return timeout_s_; }

 private:
  using Clock = std::chrono::steady_clock;
  void run();
  void finish(int64_t sequence);

  const int rank_;
  const double timeout_s_;
  const Clock::duration timeout_;
  const OnTimeout on_timeout_;

  std::mutex mutex_;
  std::condition_variable changed_;
  bool stopping_ = false;
  // The open watch, if any, and whether its timeout has been reported.
  bool open_ = false;
  bool reported_ = false;
  std::string op_;
  int64_t sequence_ = 0;
  int64_t step_ = 0;
  Clock::time_point started_;

  std::thread thread_;  // last: starts after every member above is initialised
};

}  // namespace mixprec::dist
