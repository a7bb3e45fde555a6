// CaptureGate: keeps other threads off the CUDA backend while one thread captures its stream
// into a CUDA graph (cuda/cuda_graph.h).
//
// Why: a data prefetcher uploads batches from its own thread (apps/data/prefetcher.h). During
// a capture its copy would be recorded into the graph, or refused, and in the global capture
// mode its allocations (cudaMalloc, event queries) would invalidate the capture. So:
// - close() is held by the capturing thread for the whole capture; it waits for the other
//   threads' calls already inside the backend to finish;
// - pass() is held by the backend's entry points that other threads call (allocate,
//   deallocate, copy_from_host) for the length of the call: on another thread it waits while
//   the gate is closed; on the capturing thread it passes at once (the body's own allocations
//   must go on).
#pragma once

#include <atomic>
#include <mutex>
#include <shared_mutex>
#include <thread>

namespace mixprec {

class CaptureGate {
 public:
  // Held while the calling thread captures.
  class Closed {
   public:
    explicit Closed(CaptureGate& gate) : gate_(gate), lock_(gate.mutex_) {
      gate_.owner_.store(std::this_thread::get_id(), std::memory_order_release);
    }
    ~Closed() { gate_.owner_.store(std::thread::id(), std::memory_order_release); }
    Closed(const Closed&) = delete;
    Closed& operator=(const Closed&) = delete;

   private:
    CaptureGate& gate_;
    std::unique_lock<std::shared_mutex> lock_;
  };

  // Held for one backend call; empty (holding nothing) on the capturing thread.
  class Passage {
   public:
    explicit Passage(CaptureGate& gate) {
      if (gate.owner_.load(std::memory_order_acquire) != std::this_thread::get_id())
        lock_ = std::shared_lock<std::shared_mutex>(gate.mutex_);
    }

   private:
    std::shared_lock<std::shared_mutex> lock_;
  };

  [[nodiscard]] Closed close() { return Closed(*this); }
  [[nodiscard]] Passage pass() { return Passage(*this); }

 private:
  std::shared_mutex mutex_;
  // The capturing thread; a default id (no thread's) while the gate is open.
  std::atomic<std::thread::id> owner_{};
};

}  // namespace mixprec
