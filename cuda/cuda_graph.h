// A CUDA graph of the work the CUDA backend queues: captured once, replayed many times, so
// that a step of many small launches costs the host one cudaGraphLaunch (the models here are
// launch-bound).
//
// Contract:
// - The constructor runs `body` while the backend's stream is being captured (global mode):
//   the kernels, copies and library calls it queues are recorded, not run. Nothing runs until
//   replay(). Each replay runs the recorded work on the stream, in order, on the memory it
//   was recorded with: inputs change between replays by writing into the same tensors, and
//   outputs are read from the tensors `body` left behind.
// - While capturing, the calling thread's allocations come from a private pool of the
//   backend's allocator (cuda/caching_allocator.h), which keeps their addresses for this
//   graph until it is destroyed; tensors created by `body` and kept outside it stay valid.
// - The multi-tensor tables the backend uploads for its own kernels (unscale, gradient
//   widening, norms, clip, optimizer steps) are captured as copies from pinned buffers that
//   the graph keeps: every replay uses the tables of the capture, so the tensors they point
//   to must stay alive as long as the graph.
// - What a capture cannot hold fails the capture: a host synchronisation (copy_to_host,
//   item(), all_finite), an upload of caller data (copy_from_host, Tensor::to), a kernel
//   profile in progress (set_kernel_profile). The constructor then ends the capture, frees what it
//   took and throws mixprec::Error naming the cause; the backend stays usable.
// - Other threads' allocations and uploads (a data prefetcher's) wait while the constructor
//   captures (cuda/capture_gate.h); no other thread may queue other work on the backend
//   meanwhile (it would be recorded into the graph, or would break the capture).
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include <cuda_runtime_api.h>

#include "cuda/caching_allocator.h"

namespace mixprec {

class CudaBackend;

class CudaGraph {
 public:
  // Into a private pool of the graph's own.
  CudaGraph(CudaBackend& backend, const std::function<void()>& body);
  // Into `pool`, which the caller keeps alive longer than the graph: a graph captured after
  // this one is destroyed reuses the blocks this one freed.
  CudaGraph(CudaBackend& backend, const std::function<void()>& body, const PrivatePool& pool);
  // Waits for the stream (no replay may still read the graph's staged tables), then destroys
  // the graph and releases its own private pool (blocks still in use by tensors join the
  // common pool when those are freed); a shared pool keeps its blocks.
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Queues one run of the recorded work on the backend's stream; does not wait for it.
  void replay();
  // The number of recorded operations (kernels, copies, library calls).
  size_t nodes() const;

 private:
  // Both constructors: captures `body` into pool_, releasing the pool on failure if owned.
  void capture(const std::function<void()>& body);
  void drop_pool() noexcept;

  CudaBackend& backend_;
  CachingAllocator::PoolId pool_;
  bool owns_pool_;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  std::vector<void*> staging_;  // pinned tables the captured copies read (capture_staging.h)
};

}  // namespace mixprec
