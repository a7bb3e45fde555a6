// Prefetcher: while the trainer works on batch n, a background thread builds batch n + 1
// (BatchSource::train_batch is a pure function of the number, so this changes nothing but
// the wall time). An exception thrown while building is rethrown by next() for that batch.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include "apps/data/batch.h"

namespace mixprec {

class Prefetcher {
 public:
  // Starts building batch `first` at once.
  Prefetcher(const BatchSource& source, int64_t first);
  ~Prefetcher();  // stops and joins the thread; never throws
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Returns batch first, first + 1, ... in order, and starts building the following one.
  Batch next();

 private:
  void run();
  const BatchSource& source_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int64_t wanted_ = 0;   // the number the worker builds next
  std::optional<Batch> ready_;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace mixprec
