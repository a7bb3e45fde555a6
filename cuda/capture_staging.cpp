#include "cuda/capture_staging.h"

#include <cstring>
#include <utility>

#include "cuda/cuda_check.h"

namespace mixprec {

CaptureStaging::~CaptureStaging() { release(buffers_); }

void CaptureStaging::upload(void* dst, const void* bytes, size_t n, cudaStream_t stream) {
  void* pinned = nullptr;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  const cudaError_t allocated = cudaHostAlloc(&pinned, n, cudaHostAllocDefault);
  CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  CUDA_CHECK(allocated);
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    try {
      buffers_.push_back(pinned);
    } catch (...) {
      cudaFreeHost(pinned);
      throw;
    }
  }
  std::memcpy(pinned, bytes, n);
  CUDA_CHECK(cudaMemcpyAsync(dst, pinned, n, cudaMemcpyHostToDevice, stream));
}

std::vector<void*> CaptureStaging::take() {
  const std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(buffers_, {});
}

void CaptureStaging::release(const std::vector<void*>& buffers) noexcept {
  for (void* buffer : buffers) cudaFreeHost(buffer);
  cudaGetLastError();
}

}  // namespace mixprec
