#include "cuda/pinned_upload.h"

#include <algorithm>
#include <cstring>

#include <cuda_runtime_api.h>

#include "core/error.h"
#include "cuda/cuda_check.h"

namespace mixprec {
namespace {

// Each staged region is rounded up to this, so that every region starts 256-byte aligned, as
// device allocations do: the copy engine then reads the source in whole lines.
constexpr size_t kRegionAlignment = 256;

// Whether the work before `event` has completed, without waiting. cudaEventQuery reports "not
// yet" as an error status, which the runtime may also keep as the thread's last error; that
// status is cleared so that the next launch check does not report it. When an earlier error
// is already pending, the query is not made at all (its status would replace the pending one,
// and clearing it would hide that error from the check it belongs to): the answer is then
// "not known to be complete".
bool has_completed(cudaEvent_t event) {
  if (cudaPeekAtLastError() != cudaSuccess) return false;
  const cudaError_t status = cudaEventQuery(event);
  if (status == cudaSuccess) return true;
  if (status == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  CUDA_CHECK(status);
  return false;
}

}  // namespace

UploadRegions::UploadRegions(size_t capacity) : capacity_(capacity) {
  MIXPREC_CHECK(capacity > 0, "UploadRegions: the capacity must be positive, got ", capacity);
}

PinnedUploadRing::PinnedUploadRing(size_t capacity) : regions_(capacity) {}

PinnedUploadRing::~PinnedUploadRing() {
  // Statuses are ignored: at process exit the runtime may already be unloading. The regions
  // still in flight are waited for so that no copy reads the memory after it is freed.
  for (const UploadRegions::Region& region : regions_.in_flight()) {
    cudaEventSynchronize(events_[region.id]);
  }
  for (cudaEvent_t event : events_) cudaEventDestroy(event);
  if (memory_ != nullptr) cudaFreeHost(memory_);
  cudaGetLastError();
}

bool PinnedUploadRing::ensure_memory() {
  if (memory_ != nullptr) return true;
  if (memory_failed_) return false;
  // With an error already pending, a failure of cudaHostAlloc could be that error rather than
  // a lack of page-locked memory: this upload goes directly, and the allocation is tried again
  // by a later one.
  if (cudaPeekAtLastError() != cudaSuccess) return false;
  void* memory = nullptr;
  if (cudaHostAlloc(&memory, capacity(), cudaHostAllocDefault) != cudaSuccess || memory == nullptr) {
    // Page-locked memory is a limited resource of the host, not a fault of the program: the
    // uploads still work from pageable memory.
    cudaGetLastError();
    memory_failed_ = true;
    return false;
  }
  memory_ = static_cast<unsigned char*>(memory);
  return true;
}

void PinnedUploadRing::upload(void* dst, const void* src, size_t n, CUstream_st* stream) {
  if (n == 0) return;
  if (n > capacity() || !ensure_memory()) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream));
    ++direct_;
    return;
  }
  // Regions whose copies have finished free their event slots without waiting, so that the
  // queue, and the number of events, stay as short as the device's lag behind the host.
  regions_.drop_completed([&](const UploadRegions::Region& region) {
    if (!has_completed(events_[region.id])) return false;
    free_slots_.push_back(region.id);
    return true;
  });

  uint64_t slot = 0;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    cudaEvent_t event = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    events_.push_back(event);
    slot = events_.size() - 1;
  }

  const size_t reserved = std::min((n + kRegionAlignment - 1) / kRegionAlignment * kRegionAlignment,
                                   capacity());
  size_t offset = 0;
  try {
    // A region not known to be complete is waited for and counted, also when it is unknown
    // only because an error was pending (the synchronisation may then have found it done).
    offset = regions_.place(reserved, slot, [&](const UploadRegions::Region& region) {
      cudaEvent_t event = events_[region.id];
      if (!has_completed(event)) {
        CUDA_CHECK(cudaEventSynchronize(event));
        ++waits_;
      }
      free_slots_.push_back(region.id);
    });
  } catch (...) {
    free_slots_.push_back(slot);
    throw;
  }

  // From here the region is in flight under `slot`. Until the event is recorded, the slot's
  // event is one that has completed (or was never recorded, which counts as complete), so a
  // failure below leaves a region that the next upload reuses at once, as nothing reads it.
  std::memcpy(memory_ + offset, src, n);
  CUDA_CHECK(cudaMemcpyAsync(dst, memory_ + offset, n, cudaMemcpyHostToDevice, stream));
  const cudaError_t recorded = cudaEventRecord(events_[slot], stream);
  if (recorded != cudaSuccess) {
    // The copy is queued but nothing marks its end: let it finish before the region can be
    // handed out again.
    cudaStreamSynchronize(stream);
    CUDA_CHECK(recorded);
  }
  ++staged_;
}

}  // namespace mixprec
