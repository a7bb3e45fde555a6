#include "cuda/cuda_graph.h"

#include <exception>
#include <memory>
#include <string>

#include "core/error.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "cuda/kernel_profile.h"

namespace mixprec {
namespace {

// The capture's outcome as a sentence: what `body` threw, else why the runtime refused it.
std::string capture_failure(const std::exception_ptr& thrown, cudaError_t ended) {
  if (thrown) {
    try {
      std::rethrow_exception(thrown);
    } catch (const std::exception& e) {
      return e.what();
    } catch (...) {
      return "an exception that is not a std::exception";
    }
  }
  return std::string(cudaGetErrorName(ended)) + " (" + cudaGetErrorString(ended) +
         ") from cudaStreamEndCapture";
}

}  // namespace

CudaGraph::CudaGraph(CudaBackend& backend, const std::function<void()>& body)
    : backend_(backend), pool_(backend.allocator().create_private_pool()), owns_pool_(true) {
  capture(body);
}

CudaGraph::CudaGraph(CudaBackend& backend, const std::function<void()>& body,
                     const PrivatePool& pool)
    : backend_(backend), pool_(pool.id()), owns_pool_(false) {
  capture(body);
}

void CudaGraph::drop_pool() noexcept {
  if (!owns_pool_) return;
  try {
    backend_.allocator().release_private_pool(pool_);
  } catch (const std::exception&) {
    // Only a routing still in place can refuse; none outlives capture().
  }
}

void CudaGraph::capture(const std::function<void()>& body) {
  CudaBackend& backend = backend_;
  CachingAllocator& allocator = backend.allocator();
  const cudaStream_t stream = backend.stream();
  if (kernel_profile_enabled()) {
    drop_pool();
    MIXPREC_FAIL("cuda: cannot capture a CUDA graph while the kernel profile is on: its "
                 "events would be recorded into the graph (set_kernel_profile(false), or unset "
                 "MIXPREC_KERNEL_PROFILE)");
  }
  // Other threads' uploads and allocations wait until the capture has ended.
  const auto closed = backend.capture_gate().close();
  if (const cudaError_t begun = cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal);
      begun != cudaSuccess) {
    cudaGetLastError();
    drop_pool();
    MIXPREC_FAIL("cuda: cannot begin capturing a CUDA graph on the backend's stream: ",
                 cudaGetErrorName(begun), " (", cudaGetErrorString(begun), ")");
  }
  std::exception_ptr thrown;
  {
    PoolRouting routing(allocator, pool_);
    try {
      body();
    } catch (...) {
      thrown = std::current_exception();
    }
  }
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph_);
  staging_ = backend.take_capture_staging();
  if (thrown || ended != cudaSuccess) {
    cudaGetLastError();  // the refused call's status; the capture is over
    if (graph_ != nullptr) cudaGraphDestroy(graph_);
    graph_ = nullptr;
    CaptureStaging::release(staging_);  // nothing ran: no copy reads them
    drop_pool();
    MIXPREC_FAIL("cuda: capturing a CUDA graph failed: ", capture_failure(thrown, ended),
                 ". A graph can hold only work queued on the device: no host synchronisation "
                 "(copy_to_host, item(), all_finite), no upload from the host, no kernel "
                 "profile, and no other thread using the backend meanwhile");
  }
  if (const cudaError_t made = cudaGraphInstantiate(&exec_, graph_, 0); made != cudaSuccess) {
    cudaGetLastError();
    cudaGraphDestroy(graph_);
    CaptureStaging::release(staging_);
    drop_pool();
    MIXPREC_FAIL("cuda: cudaGraphInstantiate failed: ", cudaGetErrorName(made), " (",
                 cudaGetErrorString(made), ")");
  }
}

CudaGraph::~CudaGraph() {
  try {
    backend_.synchronize();
  } catch (const std::exception&) {
    // A failed device has no copies in flight worth waiting for.
  }
  cudaGraphExecDestroy(exec_);
  cudaGraphDestroy(graph_);
  CaptureStaging::release(staging_);
  cudaGetLastError();
  drop_pool();
}

void CudaGraph::replay() { CUDA_CHECK(cudaGraphLaunch(exec_, backend_.stream())); }

namespace {

// StepGraphs on the CUDA backend: one CudaGraph at a time, all in one pool. The dropout base
// lives in one device word, written (stream-ordered, without a host sync) before the
// recording and before each replay; the recorded dropout kernels read it as they run.
class CudaStepGraphs final : public StepGraphs {
 public:
  explicit CudaStepGraphs(CudaBackend& backend)
      : backend_(backend), pool_(backend.allocator()),
        dropout_base_(static_cast<uint64_t*>(backend.allocate(sizeof(uint64_t)))) {}
  ~CudaStepGraphs() override {
    graph_.reset();
    backend_.deallocate(dropout_base_, sizeof(uint64_t));
  }
  CudaStepGraphs(const CudaStepGraphs&) = delete;
  CudaStepGraphs& operator=(const CudaStepGraphs&) = delete;

  void record(const std::function<void()>& body, uint64_t dropout_base) override {
    graph_.reset();
    set_base(dropout_base);
    // Keys relative to the base for the capture only, also when it fails.
    struct RelativeKeys {
      CudaBackend& backend;
      ~RelativeKeys() { backend.set_relative_dropout_keys(nullptr, 0); }
    } relative{backend_};
    backend_.set_relative_dropout_keys(dropout_base_, dropout_base);
    graph_ = std::make_unique<CudaGraph>(backend_, body, pool_);
  }
  void replay(uint64_t dropout_base) override {
    MIXPREC_CHECK(graph_ != nullptr, "cuda: replay of a step graph that was not recorded");
    set_base(dropout_base);
    graph_->replay();
  }
  void drop() override { graph_.reset(); }
  bool recorded() const override { return graph_ != nullptr; }

 private:
  void set_base(uint64_t value) {
    backend_.copy_from_host(dropout_base_, &value, sizeof(value));
  }

  CudaBackend& backend_;
  PrivatePool pool_;  // outlives graph_ (declared before it)
  uint64_t* dropout_base_;
  std::unique_ptr<CudaGraph> graph_;
};

}  // namespace

std::unique_ptr<StepGraphs> CudaBackend::make_step_graphs() {
  return std::make_unique<CudaStepGraphs>(*this);
}

size_t CudaGraph::nodes() const {
  size_t count = 0;
  CUDA_CHECK(cudaGraphGetNodes(graph_, nullptr, &count));
  return count;
}

}  // namespace mixprec
