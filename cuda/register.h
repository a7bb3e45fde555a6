// Start-up of the CUDA backend, and the figures a training loop reports about it. Safe to
// include anywhere: no CUDA headers.
//
// The backend is installed by an explicit call rather than by a static initializer, because
// a linker drops an unreferenced object file of a static library together with its
// initializers.
#pragma once

#include <cstdint>

#include "cuda/caching_allocator.h"

namespace mixprec {

// Registers the CUDA backend for cuda:0 with core/backend.h when a CUDA device is present,
// and returns whether a CUDA backend is registered afterwards (true also when one already
// was). Returns false, without throwing, when there is no driver or no device; throws
// mixprec::Error when a device exists but cannot be set up. Call it once at start-up,
// before any tensor lives on cuda:0 (registration is not synchronised with other threads).
bool register_cuda_backend();

// Host synchronisations of the registered CUDA backend so far (see cuda/cuda_backend.h);
// 0 when none is registered. A training loop reports the difference per step.
uint64_t cuda_host_syncs();

// The registered CUDA backend's allocator statistics; all zero when none is registered.
CudaAllocatorStats cuda_allocator_stats();

// Restarts the registered allocator's peaks at the current use (nothing when none is
// registered), so that one process can measure the peak of several runs one after another.
void cuda_reset_allocator_peaks();

}  // namespace mixprec
