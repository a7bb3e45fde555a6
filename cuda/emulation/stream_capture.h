// Stream capture and CUDA graphs for the emulated runtime (runtime_emulation.h): the part of
// cudaStreamBeginCapture / cudaStreamEndCapture / cudaGraphInstantiate / cudaGraphLaunch that
// capturing a training step needs, so that capture can be built and tested without a GPU.
//
// Emulated streams run their work at once. While a stream is being captured, work queued on
// it (kernel launches, cudaMemcpyAsync, cudaMemsetAsync, cudaLaunchHostFunc, event records,
// cuBLASLt matmuls, cuDNN convolutions) is not run but appended to the capture as a node that
// holds its arguments by value; launching the instantiated graph runs the nodes in capture
// order on the calling thread. A graph is a chain: one stream, no forks.
//
// What a GPU refuses during capture is refused here too, with the same error codes, so that a
// test on the CPU fails where the GPU would:
// - "Potentially unsafe" calls (cudaMalloc, cudaFree, cudaHostAlloc, cudaFreeHost, the
//   synchronous cudaMemcpy and cudaMemset, cudaStreamSynchronize, cudaDeviceSynchronize,
//   cudaEventSynchronize, cudaEventQuery) answer cudaErrorStreamCaptureUnsupported and
//   invalidate the captures that prohibit them, under the rules of
//   cudaThreadExchangeStreamCaptureMode. The calling thread's own mode (Global unless it
//   exchanged it) decides: in Global mode it is prohibited by its own captures begun in Global
//   or ThreadLocal mode and by other threads' captures begun in Global mode; in ThreadLocal
//   mode by its own captures begun in Global or ThreadLocal mode; in Relaxed mode never.
// - Synchronizing the capturing stream itself is refused in every mode.
// - Querying or synchronizing an event last recorded in a capture answers
//   cudaErrorCapturedEvent.
// - An invalid launch configuration during capture invalidates the capture.
// - cudaStreamEndCapture of an invalidated capture answers cudaErrorStreamCaptureInvalidated
//   and no graph; from another thread than the one that began it (unless Relaxed)
//   cudaErrorStreamCaptureWrongThread.
// Departure: a GPU checks many arguments only when the graph runs; here a node's checks (copy
// bounds, for one) run both when it is captured and when it is replayed.
#pragma once

#include <functional>

#include <cuda_runtime_api.h>

namespace mixprec::emulation {

// Whether `stream` is being captured now; one atomic load when nothing is.
bool capturing(cudaStream_t stream);

// Appends `node` to the capture of `stream` and sets `status` (cudaSuccess, or
// cudaErrorStreamCaptureInvalidated when the capture was invalidated already); false, with
// nothing done, when the stream is not being captured.
bool append_to_capture(cudaStream_t stream, std::function<void()>&& node, cudaError_t& status);

// Runs `work` now when `stream` is not being captured, and answers cudaSuccess. While it is,
// appends a copy of `work` to the capture instead (cudaSuccess), or answers
// cudaErrorStreamCaptureInvalidated when the capture was invalidated already. A call that
// captures nothing pays no copy of `work`.
template <class Work>
cudaError_t enqueue(cudaStream_t stream, const Work& work) {
  if (capturing(stream)) {
    cudaError_t status = cudaSuccess;
    if (append_to_capture(stream, std::function<void()>(work), status)) return status;
  }
  work();
  return cudaSuccess;
}

// cudaSuccess when the calling thread may make a potentially unsafe call now (the rules
// above); otherwise invalidates the captures that prohibit it and answers
// cudaErrorStreamCaptureUnsupported.
cudaError_t check_unsafe_call();

// For cudaStreamSynchronize: check_unsafe_call(), and also refused (invalidating the capture)
// when `stream` itself is being captured, whatever the mode.
cudaError_t check_stream_synchronize(cudaStream_t stream);

// Marks the capture of `stream` invalid (an error inside it); no-op when it is not captured.
void invalidate_capture(cudaStream_t stream);

}  // namespace mixprec::emulation
