// The CPU backend's cache of freed buffers (core/cpu/cpu_memory.cpp). A training step frees
// and reallocates the same activation and gradient buffers on every step; handed back to
// malloc, the large ones return to the kernel (mmap'ed, or trimmed off the heap) and every
// page of their next allocation costs a page fault and a zeroing. So CpuBackend::deallocate
// keeps buffers of at least kMinCachedBytes, by size, and allocate hands them out again:
//   - a request is served by a cached buffer of the same size class (the request rounded up
//     to a whole number of 4 KiB pages), never a larger one;
//   - the cache holds at most kMaxCachedBytes; a buffer that would exceed it is freed;
//   - a request that finds nothing frees the buffers that no request has taken for the last
//     kIdleRequests cacheable requests, so a workload that changes shape (training, then
//     evaluation) does not keep the old shapes' memory.
// It is thread-safe. Cached memory stays in the process's resident set: a caller that
// measures peak memory across several runs in one process calls release_cached_buffers()
// between them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mixprec::cpu {

inline constexpr size_t kMinCachedBytes = size_t{256} << 10;
inline constexpr size_t kMaxCachedBytes = size_t{512} << 20;
inline constexpr uint64_t kIdleRequests = 4096;

// Bytes held by the cache now (freed buffers waiting for reuse).
size_t cached_buffer_bytes();

// Frees every cached buffer.
void release_cached_buffers();

}  // namespace mixprec::cpu
