// Prefetcher: one worker thread, one slot. The worker builds `wanted_` while the trainer runs
// on the previous batch; next() takes the slot and asks for the following number.
#include "apps/data/prefetcher.h"

#include <utility>

namespace mixprec {

Prefetcher::Prefetcher(const BatchSource& source, int64_t first)
    : source_(source), wanted_(first), worker_([this] { run(); }) {}

Prefetcher::~Prefetcher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void Prefetcher::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    if (ready_.has_value() || error_) {
      cv_.wait(lock, [this] { return stop_ || (!ready_.has_value() && !error_); });
      continue;
    }
    const int64_t number = wanted_;
    lock.unlock();
    std::optional<Batch> built;
    std::exception_ptr error;
    try {
      built = source_.train_batch(number);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    ready_ = std::move(built);
    error_ = error;
    cv_.notify_all();
  }
}

Batch Prefetcher::next() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [this] { return ready_.has_value() || error_; });
  if (error_) {
    // The failure belongs to this batch number; leave the worker idle so the error is not
    // replaced by one for a later batch.
    std::rethrow_exception(error_);
  }
  Batch batch = std::move(*ready_);
  ready_.reset();
  ++wanted_;
  cv_.notify_all();
  return batch;
}

}  // namespace mixprec
