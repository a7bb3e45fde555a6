// The backend's small uploads (the multi-tensor tables of the unscale, the gradient widening,
// the norms, the clip and the optimizer steps) while its stream is being captured into a CUDA
// graph (cuda/cuda_graph.h).
//
// Outside a capture such a table goes through the pinned upload ring, whose regions are
// reused as soon as the copy has run. A captured copy instead runs again at every replay,
// reading its host source then; so during a capture each table is copied into pinned host
// memory of its own, which nothing writes again, and the captured copy reads from there. The
// graph takes these buffers when its capture ends (take()) and frees them (release()) once
// no replay can still read them.
#pragma once

#include <cstddef>
#include <mutex>
#include <vector>

#include <cuda_runtime_api.h>

namespace mixprec {

class CaptureStaging {
 public:
  CaptureStaging() = default;
  // Frees what no graph took (a capture that failed part-way).
  ~CaptureStaging();
  CaptureStaging(const CaptureStaging&) = delete;
  CaptureStaging& operator=(const CaptureStaging&) = delete;

  // Queues on `stream` (being captured) a copy of `bytes` (n > 0) to device `dst` from a new
  // pinned buffer holding them; the pinned memory is taken in relaxed capture mode, which a
  // capture in progress allows. Throws mixprec::Error when a CUDA call fails.
  void upload(void* dst, const void* bytes, size_t n, cudaStream_t stream);
  // The pinned buffers staged since the last take(), now the caller's.
  std::vector<void*> take();
  // cudaFreeHost of each buffer; the caller has made sure that no queued copy reads them.
  static void release(const std::vector<void*>& buffers) noexcept;

 private:
  std::mutex mutex_;
  std::vector<void*> buffers_;
};

}  // namespace mixprec
