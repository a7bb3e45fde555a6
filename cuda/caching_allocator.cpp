#include "cuda/caching_allocator.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "cuda/cuda_check.h"

namespace mixprec {
namespace {

constexpr size_t kMinBlock = 512;
constexpr size_t kMaxStep = size_t{32} << 20;
// Far beyond any device, and small enough that rounding up cannot overflow size_t.
constexpr size_t kMaxRequest = size_t{1} << 62;

// "1234567 bytes (1.2 MiB)": exact for the reader who compares, scaled for the one who reads.
std::string bytes_text(size_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  char scaled[32];
  std::snprintf(scaled, sizeof scaled, "%.1f %s", value, units[unit]);
  return std::to_string(bytes) + " bytes" + (unit > 0 ? std::string(" (") + scaled + ")" : "");
}

// Sets the device for the calling thread: the CUDA runtime keeps the current device per
// thread, and tensors may be freed on any thread.
void use_device(int index) { CUDA_CHECK(cudaSetDevice(index)); }

}  // namespace

CachingAllocator::CachingAllocator(int device_index) : device_index_(device_index) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  // At process exit the runtime may already be unloading; its status is of no use then.
  if (cudaSetDevice(device_index_) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  const auto free_all = [](const FreeLists& lists) {
    for (const auto& [size, blocks] : lists) {
      for (void* block : blocks) cudaFree(block);
    }
  };
  free_all(cached_);
  for (const auto& [pool, lists] : private_pools_) free_all(lists);
  cudaGetLastError();
}

size_t CachingAllocator::round_size(size_t nbytes) {
  if (nbytes <= kMinBlock) return kMinBlock;
  const size_t step = std::clamp(std::bit_floor(nbytes) / 4, kMinBlock, kMaxStep);
  return (nbytes + step - 1) / step * step;
}

void* CachingAllocator::allocate(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  MIXPREC_CHECK(nbytes <= kMaxRequest, "cuda:", device_index_, ": cannot allocate ",
                bytes_text(nbytes), ", more than any device holds; check the tensor's shape");
  const size_t size = round_size(nbytes);
  std::lock_guard<std::mutex> lock(mutex_);

  PoolId pool = kCommonPool;
  if (!routes_.empty()) {
    if (const auto route = routes_.find(std::this_thread::get_id()); route != routes_.end())
      pool = route->second;
  }
  FreeLists& lists = pool == kCommonPool ? cached_ : private_pools_.at(pool);
  void* block = nullptr;
  bool hit = false;
  if (auto it = lists.find(size); it != lists.end() && !it->second.empty()) {
    block = it->second.back();
    it->second.pop_back();
    if (pool == kCommonPool) bytes_cached_ -= size;
    hit = true;
  } else {
    block = cuda_malloc_locked(nbytes, size, pool != kCommonPool);
    if (pool != kCommonPool) stats_.bytes_in_private_pools += size;
  }
  in_use_.emplace(block, Block{size, pool});
  ++stats_.allocations;
  if (hit) ++stats_.cache_hits;
  stats_.bytes_in_use += size;
  stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
  return block;
}

// A new block of `size` bytes for a request of `nbytes`. Unrouted, out of memory releases the
// common cache and retries once; routed (perhaps inside a capture), the call is made in
// relaxed capture mode and out of memory fails at once.
void* CachingAllocator::cuda_malloc_locked(size_t nbytes, size_t size, bool routed) {
  use_device(device_index_);
  void* block = nullptr;
  cudaError_t status = cudaSuccess;
  size_t released = 0;
  if (routed) {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    status = cudaMalloc(&block, size);
    CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  } else {
    status = cudaMalloc(&block, size);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // out-of-memory is not sticky; clear it before retrying
      released = bytes_cached_;
      release_cached_locked();
      status = cudaMalloc(&block, size);
    }
  }
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    const bool known = !routed && cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess;
    cudaGetLastError();
    MIXPREC_FAIL("cuda:", device_index_, ": out of memory allocating ", bytes_text(nbytes),
                 " (", bytes_text(size), " after rounding)",
                 routed ? " for a private pool (a CUDA graph's), without releasing the cache"
                        : "",
                 "; the device has ",
                 known ? bytes_text(free_bytes) : std::string("an unknown amount"),
                 " free of ", known ? bytes_text(total_bytes) : std::string("unknown"),
                 " total; the caching allocator has ", bytes_text(stats_.bytes_reserved),
                 " reserved, ", bytes_text(stats_.bytes_in_use),
                 " in use by tensors, and released ", bytes_text(released),
                 " of cached blocks before retrying. Use a smaller train.batch_size (with "
                 "train.accumulation_steps to keep the effective batch) or a smaller "
                 "model, or free tensors that are no longer needed");
  }
  CUDA_CHECK(status);
  ++stats_.cuda_malloc_calls;
  stats_.bytes_reserved += size;
  stats_.peak_bytes_reserved = std::max(stats_.peak_bytes_reserved, stats_.bytes_reserved);
  return block;
}

CachingAllocator::PoolId CachingAllocator::create_private_pool() {
  std::lock_guard<std::mutex> lock(mutex_);
  const PoolId pool = next_pool_++;
  private_pools_.emplace(pool, FreeLists{});
  return pool;
}

void CachingAllocator::release_private_pool(PoolId pool) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = private_pools_.find(pool);
  MIXPREC_CHECK(it != private_pools_.end(), "cuda:", device_index_,
                ": release of private pool ", pool, ", which is not live");
  for (const auto& [thread, routed] : routes_) {
    MIXPREC_CHECK(routed != pool, "cuda:", device_index_, ": release of private pool ", pool,
                  " while a thread routes its requests to it");
  }
  for (auto& [size, blocks] : it->second) {
    for (void* block : blocks) {
      cached_[size].push_back(block);
      bytes_cached_ += size;
      stats_.bytes_in_private_pools -= size;
    }
  }
  private_pools_.erase(it);
  // Blocks of the pool still in use now belong to the common pool.
  for (auto& [ptr, block] : in_use_) {
    if (block.pool != pool) continue;
    block.pool = kCommonPool;
    stats_.bytes_in_private_pools -= block.size;
  }
}

void CachingAllocator::route(std::thread::id thread, PoolId pool) {
  std::lock_guard<std::mutex> lock(mutex_);
  MIXPREC_CHECK(pool != kCommonPool && private_pools_.count(pool) > 0, "cuda:", device_index_,
                ": routing to private pool ", pool, ", which is not live");
  MIXPREC_CHECK(routes_.emplace(thread, pool).second, "cuda:", device_index_,
                ": this thread already routes its requests to private pool ",
                routes_.at(thread));
}

void CachingAllocator::unroute(std::thread::id thread) {
  std::lock_guard<std::mutex> lock(mutex_);
  routes_.erase(thread);
}

PoolRouting::PoolRouting(CachingAllocator& allocator, CachingAllocator::PoolId pool)
    : allocator_(allocator) {
  allocator_.route(std::this_thread::get_id(), pool);
}

PoolRouting::~PoolRouting() { allocator_.unroute(std::this_thread::get_id()); }

void CachingAllocator::deallocate(void* ptr) noexcept {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = in_use_.find(ptr);
  if (it == in_use_.end()) {
    std::fprintf(stderr,
                 "mixprec: cuda:%d: deallocate of %p, which the caching allocator did not hand "
                 "out (freed twice, or allocated elsewhere); ignored\n",
                 device_index_, ptr);
    return;
  }
  const auto [size, pool] = it->second;
  in_use_.erase(it);
  stats_.bytes_in_use -= size;
  try {
    if (pool != kCommonPool) {
      private_pools_.at(pool)[size].push_back(ptr);
    } else {
      cached_[size].push_back(ptr);
      bytes_cached_ += size;
    }
  } catch (...) {
    // No host memory for the free list: give the block back to the device instead.
    cudaFree(ptr);
    cudaGetLastError();
    ++stats_.cuda_free_calls;
    stats_.bytes_reserved -= size;
    if (pool != kCommonPool) stats_.bytes_in_private_pools -= size;
  }
}

void CachingAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mutex_);
  use_device(device_index_);
  release_cached_locked();
}

void CachingAllocator::release_cached_locked() {
  // Each block leaves the books before cudaFree, so a failure part-way leaves no block both
  // freed and listed.
  for (auto& [size, blocks] : cached_) {
    while (!blocks.empty()) {
      void* block = blocks.back();
      blocks.pop_back();
      bytes_cached_ -= size;
      stats_.bytes_reserved -= size;
      ++stats_.cuda_free_calls;
      CUDA_CHECK(cudaFree(block));
    }
  }
  cached_.clear();
}

CudaAllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peaks() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_bytes_in_use = stats_.bytes_in_use;
  stats_.peak_bytes_reserved = stats_.bytes_reserved;
}

}  // namespace mixprec
