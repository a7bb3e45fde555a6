// A caching allocator for device memory: blocks freed by tensors go to per-size free lists
// and serve later requests of the same size class, so a training loop whose step allocates
// the same sizes every time calls cudaMalloc only while warming up.
//
// Contract:
// - Requests are rounded up to a size class (round_size): 512 bytes at least, then four
//   classes per power of two (at most 25% waste), with steps never coarser than 32 MiB. A
//   request is served by a cached block of exactly its class, else by a new cudaMalloc.
// - Blocks are reused in stream order, without events: a block freed while queued work may
//   still read it can be handed out at once, which is safe because the CUDA backend runs all
//   of its kernels and copies on one stream. Memory used on another stream must not be
//   returned through this allocator before that stream has finished with it.
// - When cudaMalloc reports out-of-memory, every cached block is released and the call is
//   retried once; a second failure throws mixprec::Error naming the bytes asked for, the
//   device's free and total memory and what this allocator holds.
// - Thread-safe (one mutex). Statistics are exact and cheap to read, for tests and
//   benchmarks.
//
// This header includes no CUDA headers, so that apps can read the statistics.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace mixprec {

struct CudaAllocatorStats {
  uint64_t cuda_malloc_calls = 0;  // successful cudaMalloc calls
  uint64_t cuda_free_calls = 0;    // cudaFree calls (only release_cached and the destructor)
  uint64_t allocations = 0;        // allocate() calls that returned a block
  uint64_t cache_hits = 0;         // ... of which were served from the cache
  size_t bytes_reserved = 0;       // held from cudaMalloc: in use plus cached
  size_t bytes_in_use = 0;         // in blocks handed out, counted at their rounded size
  size_t peak_bytes_in_use = 0;
  size_t peak_bytes_reserved = 0;
};

class CachingAllocator {
 public:
  // Manages memory of CUDA device `device_index`; no memory is taken until the first
  // allocate().
  explicit CachingAllocator(int device_index);
  // Frees the cached blocks. Blocks still handed out are left alone (their owners may
  // outlive this object during process exit, when the CUDA runtime is being torn down).
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least nbytes bytes, 256-byte aligned (cudaMalloc's alignment).
  // nbytes == 0 returns null. Throws mixprec::Error when the device is out of memory.
  void* allocate(size_t nbytes);
  // Returns a block from allocate() to its free list; null is ignored. A pointer this
  // allocator did not hand out is reported on stderr and otherwise ignored.
  void deallocate(void* ptr) noexcept;
  // cudaFree of every cached block (waits for the device). Blocks in use stay valid.
  void release_cached();

  CudaAllocatorStats stats() const;
  // Restarts both peaks at the current values.
  void reset_peaks();
  int device_index() const { return device_index_; }

  // The size class of a request of nbytes (> 0) bytes.
  static size_t round_size(size_t nbytes);

 private:
  void release_cached_locked();

  const int device_index_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, size_t> in_use_;      // block -> its rounded size
  std::map<size_t, std::vector<void*>> cached_;  // rounded size -> free blocks
  size_t bytes_cached_ = 0;
  CudaAllocatorStats stats_;
};

// Device memory from `allocator` for one scope (a primitive's workspace): allocated on
// construction, given back on destruction. Giving it back right after the scope's launches
// is safe on the one stream the allocator serves: later users of the block run after them.
class Scratch {
 public:
  Scratch(CachingAllocator& allocator, size_t nbytes)
      : allocator_(allocator), ptr_(allocator.allocate(nbytes)) {}
  ~Scratch() { allocator_.deallocate(ptr_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* get() const { return ptr_; }

 private:
  CachingAllocator& allocator_;
  void* ptr_;
};

}  // namespace mixprec
