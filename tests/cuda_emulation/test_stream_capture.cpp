// Stream capture in the emulated runtime (cuda/emulation/stream_capture.h): work queued on a
// capturing stream does not run but becomes a node holding its arguments by value; each launch
// of the instantiated graph runs the nodes in capture order, reading memory as it is at the
// launch; and the calls a GPU refuses during capture are refused with its error codes,
// invalidating the capture under the rules of cudaThreadExchangeStreamCaptureMode.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

#include "cuda/emulation/device_emulation.h"
#include "cuda/emulation/runtime_emulation.h"

namespace {

using mixprec::emulation::KernelLaunch;

// A stream, and device memory of n floats, released at the end of the test.
class Fixture {
 public:
  explicit Fixture(size_t n = 4) : n_(n) {
    REQUIRE(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) == cudaSuccess);
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&data_), n * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMemset(data_, 0, n * sizeof(float)) == cudaSuccess);
  }
  ~Fixture() {
    cudaFree(data_);
    cudaStreamDestroy(stream_);
    cudaGetLastError();
  }
  Fixture(const Fixture&) = delete;
  Fixture& operator=(const Fixture&) = delete;

  cudaStream_t stream() const { return stream_; }
  float* data() const { return data_; }
  std::vector<float> values() const {
    std::vector<float> out(n_);
    std::memcpy(out.data(), data_, n_ * sizeof(float));
    return out;
  }

  // data[i] = data[i] * factor + term for every i, as one kernel launch of n threads.
  void scale_add(float factor, float term) const {
    KernelLaunch(dim3(1), dim3(static_cast<unsigned>(n_)), stream_,
                 [](float* p, float f, float t) { p[threadIdx.x] = p[threadIdx.x] * f + t; })(
        data_, factor, term);
  }

 private:
  size_t n_;
  cudaStream_t stream_ = nullptr;
  float* data_ = nullptr;
};

cudaGraphExec_t instantiate(cudaGraph_t graph) {
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  return exec;
}

size_t node_count(cudaGraph_t graph) {
  size_t count = 0;
  REQUIRE(cudaGraphGetNodes(graph, nullptr, &count) == cudaSuccess);
  return count;
}

cudaStreamCaptureStatus capture_status(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  REQUIRE(cudaStreamIsCapturing(stream, &status) == cudaSuccess);
  return status;
}

// Sets the calling thread's capture mode for the scope.
class ThreadCaptureMode {
 public:
  explicit ThreadCaptureMode(cudaStreamCaptureMode mode) : previous_(mode) {
    REQUIRE(cudaThreadExchangeStreamCaptureMode(&previous_) == cudaSuccess);
  }
  ~ThreadCaptureMode() { cudaThreadExchangeStreamCaptureMode(&previous_); }
  ThreadCaptureMode(const ThreadCaptureMode&) = delete;
  ThreadCaptureMode& operator=(const ThreadCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode previous_;
};

}  // namespace

TEST_CASE("captured kernels run at each graph launch, in capture order, with their captured arguments",
          "[cuda_emulation]") {
  Fixture f;
  f.scale_add(1.0f, 1.0f);  // not captured: runs at once
  REQUIRE(f.values() == std::vector<float>(4, 1.0f));

  REQUIRE(cudaStreamBeginCapture(f.stream(), cudaStreamCaptureModeGlobal) == cudaSuccess);
  CHECK(capture_status(f.stream()) == cudaStreamCaptureStatusActive);
  f.scale_add(2.0f, 0.0f);
  f.scale_add(1.0f, 3.0f);
  CHECK(f.values() == std::vector<float>(4, 1.0f));  // nothing ran yet
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(f.stream(), &graph) == cudaSuccess);
  REQUIRE(graph != nullptr);
  CHECK(capture_status(f.stream()) == cudaStreamCaptureStatusNone);
  CHECK(node_count(graph) == 2);

  cudaGraphExec_t exec = instantiate(graph);
  REQUIRE(cudaGraphLaunch(exec, f.stream()) == cudaSuccess);
  CHECK(f.values() == std::vector<float>(4, 1.0f * 2.0f + 3.0f));  // doubled, then 3 added
  REQUIRE(cudaGraphLaunch(exec, f.stream()) == cudaSuccess);
  CHECK(f.values() == std::vector<float>(4, 5.0f * 2.0f + 3.0f));  // reads memory as it is now
  // After capture the stream runs work at once again.
  f.scale_add(0.0f, -1.0f);
  CHECK(f.values() == std::vector<float>(4, -1.0f));
  CHECK(cudaGraphExecDestroy(exec) == cudaSuccess);
  CHECK(cudaGraphDestroy(graph) == cudaSuccess);
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("captured copies and memsets read and write memory when the graph runs",
          "[cuda_emulation]") {
  Fixture f(2);
  float host[2] = {1.0f, 2.0f};
  float back[2] = {0.0f, 0.0f};
  const float seven = 7.0f;
  REQUIRE(cudaStreamBeginCapture(f.stream(), cudaStreamCaptureModeGlobal) == cudaSuccess);
  REQUIRE(cudaMemsetAsync(f.data(), 0xFF, sizeof host, f.stream()) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(f.data(), host, sizeof host, cudaMemcpyHostToDevice, f.stream()) ==
          cudaSuccess);
  f.scale_add(10.0f, 0.0f);
  REQUIRE(cudaMemcpyAsync(back, f.data(), sizeof back, cudaMemcpyDeviceToHost, f.stream()) ==
          cudaSuccess);
  // A host function is a node too.
  int calls = 0;
  REQUIRE(cudaLaunchHostFunc(f.stream(), [](void* p) { ++*static_cast<int*>(p); }, &calls) ==
          cudaSuccess);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(f.stream(), &graph) == cudaSuccess);
  CHECK(node_count(graph) == 5);
  CHECK(f.values() == std::vector<float>{0.0f, 0.0f});
  CHECK(calls == 0);

  cudaGraphExec_t exec = instantiate(graph);
  REQUIRE(cudaGraphLaunch(exec, f.stream()) == cudaSuccess);
  CHECK(back[0] == 10.0f);
  CHECK(back[1] == 20.0f);
  CHECK(calls == 1);
  // The host source is read at the launch, not at the capture.
  host[0] = seven;
  REQUIRE(cudaGraphLaunch(exec, f.stream()) == cudaSuccess);
  CHECK(back[0] == 70.0f);
  CHECK(back[1] == 20.0f);
  CHECK(calls == 2);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST_CASE("a copy outside device memory fails when captured and invalidates the capture",
          "[cuda_emulation]") {
  Fixture f(2);
  float host[4] = {};
  REQUIRE(cudaStreamBeginCapture(f.stream(), cudaStreamCaptureModeGlobal) == cudaSuccess);
  CHECK(cudaMemcpyAsync(f.data(), host, sizeof host, cudaMemcpyHostToDevice, f.stream()) ==
        cudaErrorInvalidValue);
  CHECK(capture_status(f.stream()) == cudaStreamCaptureStatusInvalidated);
  // Later work on the invalidated capture is refused.
  CHECK(cudaMemsetAsync(f.data(), 0, sizeof(float), f.stream()) ==
        cudaErrorStreamCaptureInvalidated);
  cudaGraph_t graph = reinterpret_cast<cudaGraph_t>(&f);
  CHECK(cudaStreamEndCapture(f.stream(), &graph) == cudaErrorStreamCaptureInvalidated);
  CHECK(graph == nullptr);
  CHECK(capture_status(f.stream()) == cudaStreamCaptureStatusNone);
}

TEST_CASE("an invalid launch configuration during capture invalidates it", "[cuda_emulation]") {
  Fixture f;
  REQUIRE(cudaStreamBeginCapture(f.stream(), cudaStreamCaptureModeGlobal) == cudaSuccess);
  KernelLaunch(dim3(1), dim3(2048), f.stream(), [](float* p) { p[0] = 1.0f; })(f.data());
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamEndCapture(f.stream(), &graph) == cudaErrorStreamCaptureInvalidated);
  CHECK(graph == nullptr);
  CHECK(f.values() == std::vector<float>(4, 0.0f));
}

TEST_CASE("potentially unsafe calls during a global capture are refused and invalidate it",
          "[cuda_emulation]") {
  Fixture f;
  void* p = nullptr;
  cudaEvent_t event = nullptr;
  REQUIRE(cudaEventCreate(&event) == cudaSuccess);
  REQUIRE(cudaEventRecord(event, nullptr) == cudaSuccess);

  using Call = cudaError_t (*)(Fixture&, void*&, cudaEvent_t);
  const std::vector<std::pair<const char*, Call>> calls = {
      {"cudaMalloc", [](Fixture&, void*& q, cudaEvent_t) { return cudaMalloc(&q, 64); }},
      {"cudaFree", [](Fixture& g, void*&, cudaEvent_t) { return cudaFree(g.data()); }},
      {"cudaMemcpy",
       [](Fixture& g, void*&, cudaEvent_t) {
         float x = 0.0f;
         return cudaMemcpy(&x, g.data(), sizeof x, cudaMemcpyDeviceToHost);
       }},
      {"cudaMemset",
       [](Fixture& g, void*&, cudaEvent_t) { return cudaMemset(g.data(), 0, 4); }},
      {"cudaDeviceSynchronize", [](Fixture&, void*&, cudaEvent_t) { return cudaDeviceSynchronize(); }},
      {"cudaStreamSynchronize of the legacy stream",
       [](Fixture&, void*&, cudaEvent_t) { return cudaStreamSynchronize(nullptr); }},
      {"cudaEventQuery", [](Fixture&, void*&, cudaEvent_t e) { return cudaEventQuery(e); }},
      {"cudaEventSynchronize",
       [](Fixture&, void*&, cudaEvent_t e) { return cudaEventSynchronize(e); }},
      {"cudaHostAlloc",
       [](Fixture&, void*& q, cudaEvent_t) { return cudaHostAlloc(&q, 64, cudaHostAllocDefault); }},
  };
  for (const auto& [name, call] : calls) {
    INFO(name);
    REQUIRE(cudaStreamBeginCapture(f.stream(), cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK(call(f, p, event) == cudaErrorStreamCaptureUnsupported);
    CHECK(cudaGetLastError() == cudaErrorStreamCaptureUnsupported);
    CHECK(p == nullptr);
    CHECK(capture_status(f.stream()) == cudaStreamCaptureStatusInvalidated);
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamEndCapture(f.stream(), &graph) == cudaErrorStreamCaptureInvalidated);
    CHECK(graph == nullptr);
  }
  // Outside a capture the same calls succeed, and the memory is still there.
  CHECK(cudaEventQuery(event) == cudaSuccess);
  CHECK(cudaMemset(f.data(), 0, 4) == cudaSuccess);
  cudaEventDestroy(event);
}

TEST_CASE("in relaxed mode unsafe calls pass, but synchronizing the capturing stream does not",
          "[cuda_emulation]") {
  Fixture f;
  SECTION("a capture begun in relaxed mode") {
    REQUIRE(cudaStreamBeginCapture(f.stream(), cudaStreamCaptureModeRelaxed) == cudaSuccess);
  }
  SECTION("a global capture, the thread exchanged into relaxed mode") {
    REQUIRE(cudaStreamBeginCapture(f.stream(), cudaStreamCaptureModeGlobal) == cudaSuccess);
  }
  {
    ThreadCaptureMode relaxed(cudaStreamCaptureModeRelaxed);
    void* p = nullptr;
    CHECK(cudaMalloc(&p, 64) == cudaSuccess);
    CHECK(cudaFree(p) == cudaSuccess);
    CHECK(capture_status(f.stream()) == cudaStreamCaptureStatusActive);
    CHECK(cudaStreamSynchronize(f.stream()) == cudaErrorStreamCaptureUnsupported);
    CHECK(capture_status(f.stream()) == cudaStreamCaptureStatusInvalidated);
  }
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamEndCapture(f.stream(), &graph) == cudaErrorStreamCaptureInvalidated);
  cudaGetLastError();
}

TEST_CASE("another thread's global capture prohibits unsafe calls in global mode only",
          "[cuda_emulation]") {
  Fixture f;
  for (const cudaStreamCaptureMode capture_mode :
       {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal}) {
    for (const cudaStreamCaptureMode thread_mode :
         {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal}) {
      INFO("capture mode " << capture_mode << ", other thread's mode " << thread_mode);
      REQUIRE(cudaStreamBeginCapture(f.stream(), capture_mode) == cudaSuccess);
      cudaError_t seen = cudaErrorUnknown;
      std::thread other([&] {
        ThreadCaptureMode mode(thread_mode);
        void* p = nullptr;
        seen = cudaMalloc(&p, 64);
        cudaFree(p);
      });
      other.join();
      const bool prohibited = capture_mode == cudaStreamCaptureModeGlobal &&
                              thread_mode == cudaStreamCaptureModeGlobal;
      CHECK(seen == (prohibited ? cudaErrorStreamCaptureUnsupported : cudaSuccess));
      cudaGraph_t graph = nullptr;
      CHECK(cudaStreamEndCapture(f.stream(), &graph) ==
            (prohibited ? cudaErrorStreamCaptureInvalidated : cudaSuccess));
      if (graph != nullptr) cudaGraphDestroy(graph);
    }
  }
}

TEST_CASE("an event recorded in a capture cannot be queried until the graph records it",
          "[cuda_emulation]") {
  Fixture f;
  cudaEvent_t event = nullptr;
  REQUIRE(cudaEventCreate(&event) == cudaSuccess);
  REQUIRE(cudaStreamBeginCapture(f.stream(), cudaStreamCaptureModeRelaxed) == cudaSuccess);
  REQUIRE(cudaEventRecord(event, f.stream()) == cudaSuccess);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(f.stream(), &graph) == cudaSuccess);
  CHECK(cudaEventQuery(event) == cudaErrorCapturedEvent);
  CHECK(cudaEventSynchronize(event) == cudaErrorCapturedEvent);
  float ms = 0.0f;
  CHECK(cudaEventElapsedTime(&ms, event, event) == cudaErrorInvalidResourceHandle);  // no time yet
  cudaGraphExec_t exec = instantiate(graph);
  REQUIRE(cudaGraphLaunch(exec, f.stream()) == cudaSuccess);
  CHECK(cudaEventQuery(event) == cudaSuccess);
  CHECK(cudaEventElapsedTime(&ms, event, event) == cudaSuccess);
  CHECK(ms == 0.0f);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaEventDestroy(event);
  cudaGetLastError();
}

TEST_CASE("capture calls in the wrong state answer the runtime's errors", "[cuda_emulation]") {
  Fixture f;
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal) ==
        cudaErrorStreamCaptureUnsupported);
  // 3 is the one value outside the named modes that the enum can hold without undefined
  // behaviour (its range is that of the smallest bit-field holding 0..2).
  CHECK(cudaStreamBeginCapture(f.stream(), static_cast<cudaStreamCaptureMode>(3)) ==
        cudaErrorInvalidValue);
  CHECK(cudaStreamEndCapture(f.stream(), &graph) == cudaErrorIllegalState);
  REQUIRE(cudaStreamBeginCapture(f.stream(), cudaStreamCaptureModeGlobal) == cudaSuccess);
  CHECK(cudaStreamBeginCapture(f.stream(), cudaStreamCaptureModeGlobal) == cudaErrorIllegalState);
  CHECK(cudaStreamEndCapture(f.stream(), nullptr) == cudaErrorInvalidValue);
  cudaError_t from_other = cudaSuccess;
  std::thread([&] { from_other = cudaStreamEndCapture(f.stream(), &graph); }).join();
  CHECK(from_other == cudaErrorStreamCaptureWrongThread);
  CHECK(capture_status(f.stream()) == cudaStreamCaptureStatusActive);  // still capturing
  REQUIRE(cudaStreamEndCapture(f.stream(), &graph) == cudaSuccess);
  CHECK(node_count(graph) == 0);
  cudaGraphNode_t nodes[1];
  size_t count = 1;
  CHECK(cudaGraphGetNodes(graph, nodes, &count) == cudaErrorNotSupported);
  CHECK(cudaGraphLaunch(nullptr, f.stream()) == cudaErrorInvalidResourceHandle);
  CHECK(cudaGraphInstantiate(nullptr, graph, 0) == cudaErrorInvalidValue);
  CHECK(std::strcmp(cudaGetErrorName(cudaErrorStreamCaptureInvalidated),
                    "cudaErrorStreamCaptureInvalidated") == 0);
  cudaGraphDestroy(graph);
  cudaGetLastError();
}

TEST_CASE("a graph launched on a capturing stream is captured as one node", "[cuda_emulation]") {
  Fixture f;
  cudaGraph_t inner = nullptr, outer = nullptr;
  REQUIRE(cudaStreamBeginCapture(f.stream(), cudaStreamCaptureModeGlobal) == cudaSuccess);
  f.scale_add(1.0f, 1.0f);
  f.scale_add(3.0f, 0.0f);
  REQUIRE(cudaStreamEndCapture(f.stream(), &inner) == cudaSuccess);
  cudaGraphExec_t inner_exec = instantiate(inner);
  REQUIRE(cudaStreamBeginCapture(f.stream(), cudaStreamCaptureModeGlobal) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(inner_exec, f.stream()) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(inner_exec, f.stream()) == cudaSuccess);
  REQUIRE(cudaStreamEndCapture(f.stream(), &outer) == cudaSuccess);
  CHECK(node_count(outer) == 2);
  CHECK(f.values() == std::vector<float>(4, 0.0f));
  cudaGraphExec_t outer_exec = instantiate(outer);
  REQUIRE(cudaGraphLaunch(outer_exec, f.stream()) == cudaSuccess);
  CHECK(f.values() == std::vector<float>(4, (1.0f * 3.0f + 1.0f) * 3.0f));
  for (cudaGraphExec_t e : {inner_exec, outer_exec}) cudaGraphExecDestroy(e);
  for (cudaGraph_t g : {inner, outer}) cudaGraphDestroy(g);
}

TEST_CASE("a kernel callable with state of its own is refused during capture", "[cuda_emulation]") {
  Fixture f;
  float* data = f.data();
  REQUIRE(cudaStreamBeginCapture(f.stream(), cudaStreamCaptureModeGlobal) == cudaSuccess);
  KernelLaunch(dim3(1), dim3(1), f.stream(), [&](float v) { data[0] = v; })(5.0f);
  CHECK(cudaGetLastError() == cudaErrorStreamCaptureUnsupported);
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamEndCapture(f.stream(), &graph) == cudaErrorStreamCaptureInvalidated);
  CHECK(f.values() == std::vector<float>(4, 0.0f));
  // Outside a capture it runs at once, as before.
  KernelLaunch(dim3(1), dim3(1), f.stream(), [&](float v) { data[0] = v; })(5.0f);
  CHECK(f.values()[0] == 5.0f);
}
