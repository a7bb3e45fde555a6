#include "cuda/emulation/stream_capture.h"

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "cuda/emulation/runtime_emulation.h"

// A captured graph, and its instantiation, are the captured work in order. The instantiation
// shares the nodes: a graph is never changed after capture, so nothing is copied.
using Nodes = std::vector<std::function<void()>>;

struct CUgraph_st {
  std::shared_ptr<const Nodes> nodes;
};

struct CUgraphExec_st {
  std::shared_ptr<const Nodes> nodes;
};

namespace mixprec::emulation {
namespace {

struct Capture {
  std::thread::id thread;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  bool invalidated = false;
  Nodes nodes;
};

struct Captures {
  std::mutex mutex;
  std::map<cudaStream_t, Capture> by_stream;
  // by_stream.size(), read without the lock so that work queued while nothing is captured
  // (every launch of a normal run) costs one atomic load.
  std::atomic<int> active{0};
};

// Never destroyed, like the runtime's memory table: static destructors may still queue work.
Captures& captures() {
  static Captures* c = new Captures;
  return *c;
}

thread_local cudaStreamCaptureMode thread_mode = cudaStreamCaptureModeGlobal;

bool valid_mode(cudaStreamCaptureMode mode) {
  return mode == cudaStreamCaptureModeGlobal || mode == cudaStreamCaptureModeThreadLocal ||
         mode == cudaStreamCaptureModeRelaxed;
}

// Whether capture `c` prohibits potentially unsafe calls from the calling thread.
bool prohibits(const Capture& c) {
  if (thread_mode == cudaStreamCaptureModeRelaxed) return false;
  if (c.thread == std::this_thread::get_id()) return c.mode != cudaStreamCaptureModeRelaxed;
  return thread_mode == cudaStreamCaptureModeGlobal && c.mode == cudaStreamCaptureModeGlobal;
}

}  // namespace

bool append_to_capture(cudaStream_t stream, std::function<void()>&& node, cudaError_t& status) {
  Captures& all = captures();
  const std::lock_guard<std::mutex> lock(all.mutex);
  const auto it = all.by_stream.find(stream);
  if (it == all.by_stream.end()) return false;
  if (it->second.invalidated) {
    status = cudaErrorStreamCaptureInvalidated;
  } else {
    it->second.nodes.push_back(std::move(node));
    status = cudaSuccess;
  }
  return true;
}

cudaError_t check_unsafe_call() {
  Captures& all = captures();
  if (all.active.load(std::memory_order_acquire) == 0) return cudaSuccess;
  const std::lock_guard<std::mutex> lock(all.mutex);
  bool refused = false;
  for (auto& [stream, capture] : all.by_stream) {
    if (!prohibits(capture)) continue;
    capture.invalidated = true;
    refused = true;
  }
  return refused ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}

cudaError_t check_stream_synchronize(cudaStream_t stream) {
  if (capturing(stream)) {
    invalidate_capture(stream);
    return cudaErrorStreamCaptureUnsupported;
  }
  return check_unsafe_call();
}

void invalidate_capture(cudaStream_t stream) {
  Captures& all = captures();
  if (all.active.load(std::memory_order_acquire) == 0) return;
  const std::lock_guard<std::mutex> lock(all.mutex);
  const auto it = all.by_stream.find(stream);
  if (it != all.by_stream.end()) it->second.invalidated = true;
}

bool capturing(cudaStream_t stream) {
  Captures& all = captures();
  if (all.active.load(std::memory_order_acquire) == 0) return false;
  const std::lock_guard<std::mutex> lock(all.mutex);
  return all.by_stream.count(stream) > 0;
}

}  // namespace mixprec::emulation

using mixprec::emulation::captures;

namespace {

// A failing status is kept for cudaGetLastError, as the runtime's other calls keep theirs.
cudaError_t fail(cudaError_t status) { return mixprec::emulation::record_error(status); }

}  // namespace

extern "C" {

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
  // The legacy default stream cannot be captured.
  if (stream == nullptr) return fail(cudaErrorStreamCaptureUnsupported);
  if (!mixprec::emulation::valid_mode(mode)) return fail(cudaErrorInvalidValue);
  auto& all = captures();
  const std::lock_guard<std::mutex> lock(all.mutex);
  if (all.by_stream.count(stream) > 0) return fail(cudaErrorIllegalState);
  mixprec::emulation::Capture capture;
  capture.thread = std::this_thread::get_id();
  capture.mode = mode;
  all.by_stream.emplace(stream, std::move(capture));
  all.active.store(static_cast<int>(all.by_stream.size()), std::memory_order_release);
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  if (graph == nullptr) return fail(cudaErrorInvalidValue);
  *graph = nullptr;
  auto& all = captures();
  const std::lock_guard<std::mutex> lock(all.mutex);
  const auto it = all.by_stream.find(stream);
  if (it == all.by_stream.end()) return fail(cudaErrorIllegalState);
  if (it->second.mode != cudaStreamCaptureModeRelaxed &&
      it->second.thread != std::this_thread::get_id())
    return fail(cudaErrorStreamCaptureWrongThread);
  mixprec::emulation::Capture capture = std::move(it->second);
  all.by_stream.erase(it);
  all.active.store(static_cast<int>(all.by_stream.size()), std::memory_order_release);
  if (capture.invalidated) return fail(cudaErrorStreamCaptureInvalidated);
  *graph = new CUgraph_st{std::make_shared<const Nodes>(std::move(capture.nodes))};
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus* status) {
  if (status == nullptr) return fail(cudaErrorInvalidValue);
  auto& all = captures();
  const std::lock_guard<std::mutex> lock(all.mutex);
  const auto it = all.by_stream.find(stream);
  *status = it == all.by_stream.end()  ? cudaStreamCaptureStatusNone
            : it->second.invalidated ? cudaStreamCaptureStatusInvalidated
                                     : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode* mode) {
  if (mode == nullptr || !mixprec::emulation::valid_mode(*mode)) return fail(cudaErrorInvalidValue);
  std::swap(*mode, mixprec::emulation::thread_mode);
  return cudaSuccess;
}

// Only the count can be asked for: the emulated nodes have no handles.
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* count) {
  if (graph == nullptr || count == nullptr) return fail(cudaErrorInvalidValue);
  if (nodes != nullptr) return fail(cudaErrorNotSupported);
  *count = graph->nodes->size();
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (exec == nullptr || graph == nullptr) return fail(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{graph->nodes};
  return cudaSuccess;
}

// Runs the nodes in capture order on the calling thread (or captures the whole replay as one
// node when `stream` is itself being captured, as a child graph would be).
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (exec == nullptr) return fail(cudaErrorInvalidResourceHandle);
  return fail(mixprec::emulation::enqueue(stream, [nodes = exec->nodes] {
    for (const auto& node : *nodes) node();
  }));
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  if (exec == nullptr) return fail(cudaErrorInvalidResourceHandle);
  delete exec;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  if (graph == nullptr) return fail(cudaErrorInvalidResourceHandle);
  delete graph;
  return cudaSuccess;
}

}  // extern "C"
