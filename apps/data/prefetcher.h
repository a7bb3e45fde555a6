// Prefetcher: while the trainer works on batch n, a background thread builds batch n + 1
// (BatchSource::train_batch is a pure function of the number, so this changes nothing but
// the wall time), and does the rest of the batch's host work there too:
// - it scans the inputs for Inf/NaN on the host (scan_inputs, apps/data/input_scan.h) and
//   sets the batch's input_scan, so the training loop's input check reads a result instead
//   of the data (unless the source has set it: images whose every pixel value maps to a
//   finite input need no scan);
// - given an input dtype, it asks the source for the batch in it (BatchSource::train_batch_as:
//   floating inputs rounded to the model's working dtype, FP16 for an FP16 run, after the
//   scan, with the CPU backend's rounding, which every backend shares; image data builds
//   them in that dtype directly); the training step's own cast then has nothing to do, and
//   an upload moves half the bytes;
// - for a device other than the CPU, it then uploads inputs and targets (Tensor::to), so the
//   trainer receives them on the device and its own `to(device)` returns them unchanged.
//   The same bytes reach the device as from the training thread. Uploading from the worker
//   is safe: the CUDA backend's copy_from_host may be called from any thread and queues
//   every copy on the backend's one stream, after everything queued before it
//   (cuda/cuda_backend.h), and its caching allocator is thread-safe and reuses blocks in that
//   stream's order (cuda/caching_allocator.h).
// An exception thrown while building, scanning or uploading is rethrown by next() for that
// batch.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include "apps/data/batch.h"
#include "core/device.h"
#include "core/dtype.h"

namespace mixprec {

class Prefetcher {
 public:
  // Starts building batch `first` at once; its batches are handed out on `device`, their
  // floating inputs in `input_dtype` when one is given (F32, F16 or BF16). Batches follow
  // each other `stride` numbers apart: a rank of N takes every N-th batch.
  Prefetcher(const BatchSource& source, int64_t first, Device device = kCPU,
             std::optional<DType> input_dtype = std::nullopt, int64_t stride = 1);
  ~Prefetcher();  // stops and joins the thread; never throws
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Returns batch first, first + stride, ... in order (input_scan set, inputs and targets on the
  // device), and starts building the following one.
  Batch next();

 private:
  void run();
  // train_batch(number), scanned and uploaded (on the worker thread).
  Batch build(int64_t number) const;

  const BatchSource& source_;
  const Device device_;
  const std::optional<DType> input_dtype_;
  std::mutex mutex_;
  std::condition_variable cv_;
  const int64_t stride_;
  int64_t wanted_ = 0;   // the number the worker builds next
  std::optional<Batch> ready_;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace mixprec
