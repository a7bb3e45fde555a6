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
// - Private pools, for CUDA graph capture: while a thread routes its requests to a private
//   pool (PoolRouting), they are served from that pool's free lists or by a new cudaMalloc
//   (in relaxed capture mode, which a capture in progress allows), never from the common
//   cache; and a block that came from a private pool goes back to it when freed, by any
//   thread and at any time, until the pool is released. A graph's addresses therefore stay
//   its own between replays: eager work (another thread's uploads, evaluation) never gets
//   them. Releasing a pool moves its free blocks to the common cache; its blocks still in use
//   join the common cache when freed. Out of memory while routing throws at once: releasing
//   the cache (cudaFree) is not allowed during a capture.
// - Thread-safe (one mutex). Statistics are exact and cheap to read, for tests and
//   benchmarks.
//
// This header includes no CUDA headers, so that apps can read the statistics.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <thread>
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
  size_t bytes_in_private_pools = 0;  // of bytes_reserved: blocks of unreleased private pools
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

  // A private pool: 0 is the common one, others come from create_private_pool().
  using PoolId = uint64_t;
  static constexpr PoolId kCommonPool = 0;
  PoolId create_private_pool();
  // Moves the pool's free blocks to the common cache; its blocks in use go there when freed.
  // Releasing the common pool, or a pool twice, is an error.
  void release_private_pool(PoolId pool);

 private:
  friend class PoolRouting;
  using FreeLists = std::map<size_t, std::vector<void*>>;  // rounded size -> free blocks
  struct Block {
    size_t size;
    PoolId pool;
  };

  void route(std::thread::id thread, PoolId pool);
  void unroute(std::thread::id thread);
  void* cuda_malloc_locked(size_t nbytes, size_t size, bool routed);
  void release_cached_locked();

  const int device_index_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, Block> in_use_;
  FreeLists cached_;  // the common pool's free blocks
  size_t bytes_cached_ = 0;
  std::unordered_map<PoolId, FreeLists> private_pools_;  // live private pools
  std::unordered_map<std::thread::id, PoolId> routes_;
  PoolId next_pool_ = 1;
  CudaAllocatorStats stats_;
};

// A private pool for the lifetime of this object: created by the constructor, released by
// the destructor. Graphs captured one after another into one pool (the training step's, one
// per window between two resolves) reuse its blocks instead of taking new memory each time.
class PrivatePool {
 public:
  explicit PrivatePool(CachingAllocator& allocator)
      : allocator_(allocator), id_(allocator.create_private_pool()) {}
  ~PrivatePool() {
    try {
      allocator_.release_private_pool(id_);
    } catch (...) {
      // Refused only while a thread routes to it, which a destroyed owner cannot do.
    }
  }
  PrivatePool(const PrivatePool&) = delete;
  PrivatePool& operator=(const PrivatePool&) = delete;
  CachingAllocator::PoolId id() const { return id_; }

 private:
  CachingAllocator& allocator_;
  CachingAllocator::PoolId id_;
};

// Routes the calling thread's requests to a private pool for its lifetime (a capture's).
// One routing per thread at a time; the pool must be live.
class PoolRouting {
 public:
  PoolRouting(CachingAllocator& allocator, CachingAllocator::PoolId pool);
  ~PoolRouting();
  PoolRouting(const PoolRouting&) = delete;
  PoolRouting& operator=(const PoolRouting&) = delete;

 private:
  CachingAllocator& allocator_;
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
