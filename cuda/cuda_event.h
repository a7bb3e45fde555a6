// A CUDA event that records timestamps, destroyed with its owner (also when the owner's scope
// is left by an exception). Creation failures throw mixprec::Error through CUDA_CHECK.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/cuda_check.h"

namespace mixprec {

class CudaEvent {
 public:
  CudaEvent() { CUDA_CHECK(cudaEventCreate(&event_)); }
  ~CudaEvent() { cudaEventDestroy(event_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace mixprec
