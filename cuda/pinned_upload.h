// Host-to-device uploads through a ring of page-locked (pinned) host memory.
//
// Why: cudaMemcpyAsync from pageable memory may wait for the stream before it returns (the
// driver stages the bytes through its own pinned buffers and, for all but small copies, can
// only reuse them once the stream has reached the copy), so a training step's batch upload
// could hold the host until the device has finished the previous step, and the host could no
// longer queue a step ahead. From pinned memory the copy is queued and the call returns.
//
// PinnedUploadRing::upload(dst, src, n, stream) copies the n bytes of src into the ring with
// the host's memcpy and queues cudaMemcpyAsync from there on `stream`, then records an event
// that marks when the device has read them. The caller may reuse src as soon as the call
// returns (the contract of Backend::copy_from_host). A region of the ring is reused only after
// its event has completed: when a new upload needs the space of regions still in flight, the
// host waits for them, oldest first, and counts one wait per region it actually had to wait for
// (waits()), since that is a host synchronisation with the device.
//
// Uploads larger than the ring's capacity, and every upload once the pinned memory could not be
// allocated, go directly from src (the pageable path, with its possible wait). The pinned
// memory is allocated on the first upload that uses it, not at construction.
//
// Not thread-safe: the owner (CudaBackend) serialises uploads. The destructor waits for every
// region still in flight before it frees the pinned memory, ignoring errors (it may run at
// process exit).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "core/error.h"

struct CUstream_st;
struct CUevent_st;

namespace mixprec {

// The bookkeeping of the ring, without CUDA: where the next region of n bytes starts, and
// which regions in flight must complete first. Regions are placed one after the other; one
// that would run past the end starts again at offset 0. In-flight regions form a queue,
// oldest first, and a new region can only overlap the oldest ones; not always a run of them
// from the front, though: one that starts again at 0 passes over the regions still in flight
// between the old head and the end, and those stay in flight, ahead of it in the queue.
class UploadRegions {
 public:
  struct Region {
    size_t begin = 0;
    size_t end = 0;   // one past the last byte
    uint64_t id = 0;  // the caller's handle for the region's completion (an event slot)
  };

  explicit UploadRegions(size_t capacity);

  size_t capacity() const { return capacity_; }

  // Places a region of n bytes (0 < n <= capacity, else mixprec::Error). `retire(region)` is
  // called, oldest first, for every in-flight region that must complete before the new one is
  // written (those overlapping it); it must return only once that region has completed. The
  // new region is then in flight with `id`. Returns its offset.
  template <class Retire>
  size_t place(size_t n, uint64_t id, Retire&& retire);

  // Drops in-flight regions from the front while `completed(region)` says they are done (a
  // cheap query; nothing waits). Returns how many were dropped.
  template <class Completed>
  size_t drop_completed(Completed&& completed);

  const std::deque<Region>& in_flight() const { return in_flight_; }

 private:
  size_t capacity_;
  size_t head_ = 0;  // where the next region starts unless it must wrap
  std::deque<Region> in_flight_;
};

// ---- UploadRegions templates ----------------------------------------------------------------

template <class Retire>
size_t UploadRegions::place(size_t n, uint64_t id, Retire&& retire) {
  MIXPREC_CHECK(n > 0 && n <= capacity_, "UploadRegions::place: a region of ", n,
                " bytes does not fit a ring of ", capacity_, " bytes (0 < n <= capacity)");
  const size_t begin = head_ + n > capacity_ ? 0 : head_;
  const size_t end = begin + n;
  // Every in-flight region is tested, not only a run from the front (see the class comment).
  // A region leaves the queue only once retire has returned, so one whose retire throws stays
  // in flight and the new region is not placed.
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    if (it->begin < end && begin < it->end) {
      retire(static_cast<const Region&>(*it));
      it = in_flight_.erase(it);
    } else {
      ++it;
    }
  }
  in_flight_.push_back(Region{begin, end, id});
  head_ = end;
  return begin;
}

template <class Completed>
size_t UploadRegions::drop_completed(Completed&& completed) {
  size_t dropped = 0;
  while (!in_flight_.empty() && completed(static_cast<const Region&>(in_flight_.front()))) {
    in_flight_.pop_front();
    ++dropped;
  }
  return dropped;
}

class PinnedUploadRing {
 public:
  // Default capacity: room for several batches of the configs' inputs.
  static constexpr size_t kDefaultCapacity = size_t{64} << 20;

  explicit PinnedUploadRing(size_t capacity = kDefaultCapacity);
  ~PinnedUploadRing();
  PinnedUploadRing(const PinnedUploadRing&) = delete;
  PinnedUploadRing& operator=(const PinnedUploadRing&) = delete;

  // Queues the copy of n bytes from host src to device dst on `stream`, as described above.
  // n == 0 does nothing. Throws mixprec::Error (through CUDA_CHECK) for a CUDA error of the
  // copy or of the ring's events.
  void upload(void* dst, const void* src, size_t n, CUstream_st* stream);

  // Host waits for an in-flight region so far (see the header comment).
  uint64_t waits() const { return waits_; }
  // Uploads that went through the ring, and those that went directly (too large, or no pinned
  // memory), for tests and logs.
  uint64_t staged_uploads() const { return staged_; }
  uint64_t direct_uploads() const { return direct_; }
  size_t capacity() const { return regions_.capacity(); }

 private:
  bool ensure_memory();

  UploadRegions regions_;
  unsigned char* memory_ = nullptr;  // capacity() bytes of cudaHostAlloc memory, or null
  bool memory_failed_ = false;       // cudaHostAlloc failed once: direct uploads from then on
  std::vector<CUevent_st*> events_;  // one per event slot; a region's id is its slot
  std::vector<uint64_t> free_slots_;
  uint64_t waits_ = 0;
  uint64_t staged_ = 0;
  uint64_t direct_ = 0;
};

}  // namespace mixprec
