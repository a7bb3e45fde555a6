// Prefetcher: one worker thread, one slot. The worker builds `wanted_` while the trainer runs
// on the previous batch; next() takes the slot and asks for the following number.
#include "apps/data/prefetcher.h"

#include <utility>

#include "apps/data/input_scan.h"
#include "core/error.h"

namespace mixprec {

namespace {

// Checked before the worker starts: a constructor that throws afterwards would destroy a
// running thread.
std::optional<DType> checked_input_dtype(std::optional<DType> dtype) {
  MIXPREC_CHECK(!dtype || is_floating(*dtype), "Prefetcher: the input dtype must be F32, F16 "
                "or BF16, got ", *dtype);
  return dtype;
}

// Checked before the worker starts: a constructor that throws after would leave it joinable.
int64_t checked_stride(int64_t stride) {
  MIXPREC_CHECK(stride >= 1, "Prefetcher: stride must be >= 1, got ", stride);
  return stride;
}

}  // namespace

Prefetcher::Prefetcher(const BatchSource& source, int64_t first, Device device,
                       std::optional<DType> input_dtype, int64_t stride)
    : source_(source), device_(device), input_dtype_(checked_input_dtype(input_dtype)),
      stride_(checked_stride(stride)), wanted_(first), worker_([this] { run(); }) {}

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
      built = build(number);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    ready_ = std::move(built);
    error_ = error;
    cv_.notify_all();
  }
}

Batch Prefetcher::build(int64_t number) const {
  // Scanned on the host, before the upload: reading the inputs back from a device would cost
  // a host synchronisation. With an input dtype the source scans and rounds (train_batch_as),
  // or builds the inputs in that dtype and knows them finite.
  Batch batch = input_dtype_ ? source_.train_batch_as(number, *input_dtype_)
                             : source_.train_batch(number);
  if (!batch.input_scan) batch.input_scan = scan_inputs(batch.inputs);
  if (!device_.is_cpu()) {
    batch.inputs = batch.inputs.to(device_);
    batch.targets = batch.targets.to(device_);
  }
  return batch;
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
  wanted_ += stride_;
  cv_.notify_all();
  return batch;
}

}  // namespace mixprec
