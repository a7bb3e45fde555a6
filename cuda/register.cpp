#include "cuda/register.h"

#include <memory>

#include "core/backend.h"
#include "cuda/cuda_backend.h"
#include "cuda/device_query.h"

namespace mixprec {
namespace {

// The registered backend, or null when the CUDA slot is empty or holds another backend.
CudaBackend* registered() {
  if (!has_backend(DeviceType::CUDA)) return nullptr;
  return dynamic_cast<CudaBackend*>(&backend_for(cuda_device(0)));
}

}  // namespace

bool register_cuda_backend() {
  if (has_backend(DeviceType::CUDA)) return true;
  if (cuda_device_count() == 0) return false;
  register_backend(DeviceType::CUDA, std::make_unique<CudaBackend>(0));
  return true;
}

uint64_t cuda_host_syncs() {
  const CudaBackend* backend = registered();
  return backend != nullptr ? backend->host_syncs() : 0;
}

CudaAllocatorStats cuda_allocator_stats() {
  const CudaBackend* backend = registered();
  return backend != nullptr ? backend->allocator().stats() : CudaAllocatorStats{};
}

void cuda_reset_allocator_peaks() {
  if (CudaBackend* backend = registered()) backend->allocator().reset_peaks();
}

}  // namespace mixprec
