// The part of the CUDA runtime that the emulated backend needs, implemented on the host:
// one device (cuda:0) whose memory is host memory, page-locked memory (cudaHostAlloc) that is
// plain host memory, streams that run everything at once, events that take the host's clock
// when recorded (and so have always completed when queried), kernel launches through
// cuda/emulation/thread_scheduler.h, and stream capture into graphs that replay the captured
// work (cuda/emulation/stream_capture.h). The runtime functions
// themselves (cudaMalloc, cudaMemcpyAsync, cudaGetLastError, ...) keep the signatures of
// <cuda_runtime_api.h> and are defined in runtime_emulation.cpp; the emulated build links
// them instead of libcudart.
//
// Departures from a GPU, on purpose:
// - cudaMalloc fills new memory with 0xFF bytes (NaN in every floating dtype), so a kernel
//   that reads memory nothing wrote produces NaN instead of a plausible number (zeros in
//   host_only() mode, below).
// - Copies check that the device side lies inside one live allocation, and return
//   cudaErrorInvalidValue when it does not (a GPU may fault, or silently read a neighbour).
// - The device has kEmulatedDeviceBytes of memory; a request beyond what is left fails with
//   cudaErrorMemoryAllocation before any host memory is touched.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <type_traits>

#include <cuda_runtime_api.h>

namespace mixprec::emulation {

inline constexpr size_t kEmulatedDeviceBytes = size_t{16} << 30;
// The most page-locked host memory one cudaHostAlloc may ask for.
inline constexpr size_t kEmulatedPinnedBytes = size_t{16} << 30;

// A kernel launch: an invalid configuration (empty grid or block, more than 1024 threads per
// block, grid.y or grid.z above 65535) is recorded for cudaGetLastError() and nothing runs,
// as on a GPU; otherwise run_grid runs every thread before the call returns.
void launch_on_cpu(dim3 grid, dim3 block, const std::function<void()>& body);

// A kernel launch on a stream being captured (stream_capture.h): an invalid configuration is
// recorded and invalidates the capture; otherwise the launch becomes a node of the capture,
// `body` holding the kernel's arguments by value.
void capture_launch(cudaStream_t stream, dim3 grid, dim3 block, std::function<void()> body);

// Records cudaErrorStreamCaptureUnsupported and invalidates the capture of `stream`.
void refuse_stateful_capture(cudaStream_t stream);

// Whether `stream` is being captured (stream_capture.h); one atomic load when nothing is.
bool stream_capturing(cudaStream_t stream);

// Keeps a failing status for cudaGetLastError (of the calling thread) and returns it.
cudaError_t record_error(cudaError_t status);

// What MIXPREC_LAUNCH (cuda/kernels/common.cuh) becomes in the emulated build: called with
// the kernel's arguments, it runs `kernel` (a callable taking them) on every thread of the
// grid through launch_on_cpu, or, on a stream being captured, records the launch with copies
// of the arguments (`kernel` must then hold no state: what it reads comes in as arguments).
template <class Kernel>
class KernelLaunch {
 public:
  KernelLaunch(dim3 grid, dim3 block, cudaStream_t stream, Kernel kernel)
      : grid_(grid), block_(block), stream_(stream), kernel_(kernel) {}

  template <class... Args>
  void operator()(Args... args) const {
    if (stream_capturing(stream_)) {
      // A kernel callable with state of its own (a lambda capturing by reference) could not
      // be replayed safely after its scope ends: such a launch is refused and invalidates the
      // capture.
      if constexpr (std::is_empty_v<Kernel>) {
        capture_launch(stream_, grid_, block_, [kernel = kernel_, args...] { kernel(args...); });
      } else {
        refuse_stateful_capture(stream_);
      }
      return;
    }
    launch_on_cpu(grid_, block_, [&] { kernel_(args...); });
  }

 private:
  dim3 grid_;
  dim3 block_;
  cudaStream_t stream_;
  Kernel kernel_;
};

// True when the environment variable MIXPREC_EMULATION_HOST_ONLY is 1 (read once): kernel
// launches, cuBLASLt matmuls, cuDNN convolutions, the radix sort, copies into device memory
// and memsets (the device's work: a GPU's copy engine moves an upload's bytes) are checked as
// usual and then do nothing, while copies to the host still move their bytes; new memory is
// zero-filled instead of NaN-filled, so that nothing reads as non-finite.
// Every result is then meaningless; what remains of a training step is the host's own cost
// (autograd, ops, argument checks, the allocator, the launch calls), which this mode exists to
// measure: `MIXPREC_EMULATION_HOST_ONLY=1 mixprec_emulated bench CONFIG --set device=cuda`.
bool host_only();

// Test hook: while set to a cublasStatus_t other than CUBLAS_STATUS_SUCCESS (0, the default),
// cublasLtMatmul answers that status to every call whose descriptor carries an epilogue,
// although the heuristic offered an algorithm for it, as a real cuBLASLt may for some layouts
// (NOT_SUPPORTED, or INVALID_VALUE for operands it cannot take); the backend must then fall
// back to its own epilogue. An int, so that this header needs no cuBLAS header.
void set_refuse_epilogue_matmuls(int status);
int refuse_epilogue_matmuls();
// The calls refused so far (counted by the matmul that refuses them).
int64_t refused_epilogue_matmuls();
void count_refused_epilogue_matmul();

// Live allocations and their bytes (for tests of the emulation itself).
size_t live_allocations();
size_t live_bytes();

}  // namespace mixprec::emulation
