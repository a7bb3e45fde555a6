// Memory, fills, casts and checks of the CPU backend.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "core/backend_checks.h"
#include "core/cpu/blocks.h"
#include "core/cpu/buffer_cache.h"
#include "core/cpu/common.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/dispatch.h"
#include "core/math/amp.h"
#include "core/philox.h"
#include "core/tensor.h"

namespace mixprec {
namespace {

// 64-byte alignment: whole cache lines and full AVX-512 vectors.
constexpr size_t kAlignment = 64;
constexpr size_t kPage = 4096;

// The buffer cache of core/cpu/buffer_cache.h. Buffers are kept by size class, each with the
// request count at which it was cached, so that long-idle ones can be found.
class BufferCache {
 public:
  // A cached buffer of `size_class` bytes, or null.
  void* take(size_t size_class) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++requests_;
    auto it = free_.find(size_class);
    if (it != free_.end() && !it->second.empty()) {
      void* p = it->second.back().data;
      it->second.pop_back();
      bytes_ -= size_class;
      return p;
    }
    drop_idle_locked();
    return nullptr;
  }

  // Keeps p (size_class bytes) for reuse; false when the cache is full and the caller frees.
  bool keep(void* p, size_t size_class) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (bytes_ + size_class > cpu::kMaxCachedBytes) return false;
    free_[size_class].push_back({p, requests_});
    bytes_ += size_class;
    return true;
  }

  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [size_class, entries] : free_)
      for (const Entry& e : entries) std::free(e.data);
    free_.clear();
    bytes_ = 0;
  }

  size_t bytes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return bytes_;
  }

 private:
  struct Entry {
    void* data;
    uint64_t cached_at;  // requests_ when it was cached
  };

  void drop_idle_locked() {
    for (auto& [size_class, entries] : free_) {
      size_t kept = 0;
      for (const Entry& e : entries) {
        if (requests_ - e.cached_at > cpu::kIdleRequests) {
          std::free(e.data);
          bytes_ -= size_class;
        } else {
          entries[kept++] = e;
        }
      }
      entries.resize(kept);
    }
  }

  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<Entry>> free_;
  size_t bytes_ = 0;
  uint64_t requests_ = 0;  // cacheable requests so far
};

// Never destroyed: tensors with static storage may free their buffers after every other
// static object is gone. The process's exit returns the memory.
BufferCache& buffer_cache() {
  static BufferCache* cache = new BufferCache();
  return *cache;
}

// The size class of a request: 0 for requests too small to cache.
size_t size_class_of(size_t nbytes) {
  if (nbytes < cpu::kMinCachedBytes) return 0;
  return (nbytes + kPage - 1) / kPage * kPage;
}

template <class T>
void store_all(Tensor& out, T value) {
  T* p = static_cast<T*>(out.data());
  const int64_t n = out.numel();
#pragma omp parallel for if (n > cpu::kParallelWorkCheap)
  for (int64_t i = 0; i < n; ++i) p[i] = value;
}

// Converts n floating elements to any other dtype through float; a float -> I32 conversion
// truncates toward zero.
template <class Src, class Dst>
void convert_elements(const Src* src, Dst* dst, int64_t n) {
#pragma omp parallel for if (n > cpu::kParallelWorkCheap)
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<Dst, int32_t>) {
      dst[i] = static_cast<int32_t>(to_float(src[i]));
    } else {
      dst[i] = from_float<Dst>(to_float(src[i]));
    }
  }
}

template <class T, class Draw>
void fill_random(T* p, int64_t n, const Draw& draw) {
#pragma omp parallel for if (n > cpu::kParallelWorkCostly)
  for (int64_t i = 0; i < n; ++i) p[i] = from_float<T>(draw(i));
}

template <class T>
bool all_finite_elements(const T* p, int64_t n) {
  int64_t bad = 0;
#pragma omp parallel for reduction(+ : bad) if (n > cpu::kParallelWorkCheap)
  for (int64_t i = 0; i < n; ++i) bad += is_finite_element(p[i]) ? 0 : 1;
  return bad == 0;
}

}  // namespace

namespace cpu {

size_t cached_buffer_bytes() { return buffer_cache().bytes(); }

void release_cached_buffers() { buffer_cache().release(); }

}  // namespace cpu

void* CpuBackend::allocate(size_t nbytes) {
  const size_t size_class = size_class_of(nbytes);
  if (size_class > 0) {
    if (void* p = buffer_cache().take(size_class)) return p;
  }
  const size_t rounded =
      size_class > 0 ? size_class : (nbytes + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (!p) throw Error("cpu: out of memory allocating " + std::to_string(nbytes) + " bytes");
  return p;
}

void CpuBackend::deallocate(void* ptr, size_t nbytes) noexcept {
  if (!ptr) return;
  const size_t size_class = size_class_of(nbytes);
  bool kept = false;
  if (size_class > 0) {
    try {
      kept = buffer_cache().keep(ptr, size_class);
    } catch (...) {  // the cache's bookkeeping could not grow: free the buffer instead
      kept = false;
    }
  }
  if (!kept) std::free(ptr);
}

void CpuBackend::copy_from_host(void* dst, const void* host_src, size_t nbytes) {
  std::memcpy(dst, host_src, nbytes);
}

void CpuBackend::copy_to_host(void* host_dst, const void* src, size_t nbytes) {
  std::memcpy(host_dst, src, nbytes);
}

void CpuBackend::fill(Tensor& out, double value) {
  if (out.dtype() == DType::I32) return store_all(out, static_cast<int32_t>(value));
  MIXPREC_DISPATCH_FLOATING(out.dtype(), "fill", [&] {
    store_all(out, from_float<scalar_t>(static_cast<float>(value)));
  });
}

void CpuBackend::arange(Tensor& out, double start, double step) {
  const int64_t n = out.numel();
  if (out.dtype() == DType::I32) {
    int32_t* p = out.data_as<int32_t>();
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(start + step * i);
    return;
  }
  MIXPREC_DISPATCH_FLOATING(out.dtype(), "arange", [&] {
    scalar_t* p = static_cast<scalar_t*>(out.data());
    for (int64_t i = 0; i < n; ++i) p[i] = from_float<scalar_t>(static_cast<float>(start + step * i));
  });
}

void CpuBackend::random_uniform(Tensor& out, PhiloxKey key, float low, float high) {
  MIXPREC_DISPATCH_FLOATING(out.dtype(), "random_uniform", [&] {
    fill_random(static_cast<scalar_t*>(out.data()), out.numel(), [&](int64_t i) {
      return low + (high - low) * philox_uniform(key.seed, key.offset + i);
    });
  });
}

void CpuBackend::random_normal(Tensor& out, PhiloxKey key, float mean, float stddev) {
  MIXPREC_DISPATCH_FLOATING(out.dtype(), "random_normal", [&] {
    fill_random(static_cast<scalar_t*>(out.data()), out.numel(), [&](int64_t i) {
      return mean + stddev * philox_normal(key.seed, key.offset + i);
    });
  });
}

void CpuBackend::cast(const Tensor& x, Tensor& y) {
  backend_checks::cast(kCPU, x, y);
  const int64_t n = x.numel();
  if (x.dtype() == y.dtype()) return copy(x, y);
  // Between F32 and F16/BF16 the bulk paths (core/cpu/blocks.h) are vectorised and
  // bit-identical to the scalar ones.
  if (x.dtype() == DType::F32 && is_floating(y.dtype())) {
    MIXPREC_DISPATCH_FLOATING(y.dtype(), "cast", [&] {
      cpu::store_f32_parallel(x.data_as<float>(), static_cast<scalar_t*>(y.data()), n);
    });
    return;
  }
  if (y.dtype() == DType::F32 && is_floating(x.dtype())) {
    MIXPREC_DISPATCH_FLOATING(x.dtype(), "cast", [&] {
      cpu::load_f32_parallel(static_cast<const scalar_t*>(x.data()), y.data_as<float>(), n);
    });
    return;
  }
  if (x.dtype() == DType::I32) {
    const int32_t* src = x.data_as<int32_t>();
    MIXPREC_DISPATCH_FLOATING(y.dtype(), "cast", [&] {
      scalar_t* dst = static_cast<scalar_t*>(y.data());
      for (int64_t i = 0; i < n; ++i) dst[i] = from_float<scalar_t>(static_cast<float>(src[i]));
    });
    return;
  }
  MIXPREC_DISPATCH_FLOATING(x.dtype(), "cast", [&] {
    const scalar_t* src = static_cast<const scalar_t*>(x.data());
    switch (y.dtype()) {
      case DType::F32: return convert_elements(src, y.data_as<float>(), n);
      case DType::F16: return convert_elements(src, y.data_as<half>(), n);
      case DType::BF16: return convert_elements(src, y.data_as<bfloat16>(), n);
      case DType::I32: return convert_elements(src, y.data_as<int32_t>(), n);
    }
  });
}

void CpuBackend::copy(const Tensor& x, Tensor& y) {
  backend_checks::copy(kCPU, x, y);
  if (x.data() != y.data()) std::memcpy(y.data(), x.data(), x.nbytes());
}

void CpuBackend::widen_gradients(const std::vector<GradientWidening>& items) {
  backend_checks::widen_gradients(kCPU, items);
  for (const GradientWidening& item : items) {
    const int64_t n = item.source->numel();
    float* dst = item.destination->data_as<float>();
    MIXPREC_DISPATCH_FLOATING(item.source->dtype(), "widen_gradients", [&] {
      const scalar_t* src = static_cast<const scalar_t*>(item.source->data());
      if (!item.accumulate) {
        cpu::load_f32_parallel(src, dst, n);
        return;
      }
      // The sum cast() then binary(Add) would give: the widening is exact, then one F32 add.
      cpu::for_each_convert_chunk(n, [&](int64_t begin, int64_t len) {
        constexpr int64_t kBlock = 4096;
        float widened[kBlock];
        for (int64_t b = begin; b < begin + len; b += kBlock) {
          const int64_t count = std::min(kBlock, begin + len - b);
          const float* w = cpu::load_f32(src + b, widened, count);
          for (int64_t i = 0; i < count; ++i) dst[b + i] = dst[b + i] + w[i];
        }
      });
    });
  }
}

bool CpuBackend::all_finite(const Tensor& x) {
  if (x.dtype() == DType::I32) return true;
  return MIXPREC_DISPATCH_FLOATING(x.dtype(), "all_finite", [&] {
    return all_finite_elements(static_cast<const scalar_t*>(x.data()), x.numel());
  });
}

int64_t CpuBackend::find_out_of_range(const Tensor& ids, int64_t upper) {
  const int32_t* p = ids.data_as<int32_t>();
  for (int64_t i = 0; i < ids.numel(); ++i)
    if (p[i] < 0 || p[i] >= upper) return i;
  return -1;
}

}  // namespace mixprec
