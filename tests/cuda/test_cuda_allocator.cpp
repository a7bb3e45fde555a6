// The caching allocator, the backend's memory primitives, registration and the host
// synchronisation counter.
#include <bit>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

#include "backend_agreement.h"
#include "core/error.h"
#include "cuda/caching_allocator.h"
#include "cuda/cuda_backend.h"
#include "cuda_backend_access.h"
#include "tests/error_message.h"

namespace {

using namespace mixprec;
using namespace mixprec::cuda_test;

using mixprec_test::error_message;

}  // namespace

TEST_CASE("cuda allocator size classes cover the request with bounded waste", "[cuda]") {
  size_t previous = 0;
  for (size_t n = 1; n < (size_t{1} << 36); n += n / 3 + 1) {
    const size_t r = CachingAllocator::round_size(n);
    INFO("request " << n << " -> " << r);
    CHECK(r >= n);
    CHECK(r % 512 == 0);
    // One step of the class grid at most: 512 bytes, a quarter of the request's power of
    // two, or 32 MiB, whichever applies.
    const size_t step = std::max<size_t>(512, std::min<size_t>(std::bit_floor(n) / 4, size_t{32} << 20));
    CHECK(r - n < step);
    CHECK(r >= previous);
    // A class size is its own class, so blocks of one class are interchangeable.
    CHECK(CachingAllocator::round_size(r) == r);
    previous = r;
  }
  CHECK(CachingAllocator::round_size(1) == 512);
  CHECK(CachingAllocator::round_size(600) == 1024);
  CHECK(CachingAllocator::round_size(4097) == 5120);  // 4096 + 4096 / 4
}

TEST_CASE("cuda backend registers only where a device exists", "[cuda]") {
  if (cuda_device_count() == 0) {
    CHECK_FALSE(register_cuda_backend());
    CHECK_FALSE(has_backend(DeviceType::CUDA));
    CHECK(cuda_host_syncs() == 0);
    CHECK(cuda_allocator_stats().cuda_malloc_calls == 0);
    WARN("no CUDA device: checked that registration declines (" << cuda_status_line() << ")");
    return;
  }
  CHECK(register_cuda_backend());
  CHECK(register_cuda_backend());  // a second call keeps the first backend
  REQUIRE(has_backend(DeviceType::CUDA));
  CHECK(gpu_backend().name() == "cuda");
  CHECK(gpu_backend().device() == gpu());
}

TEST_CASE("cuda allocator reuses freed blocks without new cudaMalloc calls", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  CachingAllocator allocator(0);
  const std::vector<size_t> sizes = {1, 511, 512, 513, 4096, size_t{1} << 20, (size_t{3} << 20) + 5};
  size_t rounded_total = 0;
  for (size_t n : sizes) rounded_total += CachingAllocator::round_size(n);

  auto step = [&] {
    std::vector<void*> blocks;
    for (size_t n : sizes) {
      void* p = allocator.allocate(n);
      REQUIRE(p != nullptr);
      CHECK(reinterpret_cast<uintptr_t>(p) % 256 == 0);
      blocks.push_back(p);
    }
    CHECK(allocator.stats().bytes_in_use == rounded_total);
    for (void* p : blocks) allocator.deallocate(p);
  };
  step();  // warm-up
  const CudaAllocatorStats warm = allocator.stats();
  CHECK(warm.cuda_malloc_calls == sizes.size());
  CHECK(warm.bytes_in_use == 0);
  CHECK(warm.bytes_reserved == rounded_total);
  CHECK(warm.peak_bytes_in_use == rounded_total);
  for (int i = 0; i < 3; ++i) step();
  const CudaAllocatorStats steady = allocator.stats();
  CHECK(steady.cuda_malloc_calls == warm.cuda_malloc_calls);
  CHECK(steady.cache_hits == 3 * sizes.size());
  CHECK(steady.allocations == 4 * sizes.size());
  CHECK(steady.bytes_reserved == rounded_total);

  // A request of another size in the same class gets the block just freed.
  void* p = allocator.allocate(1000);
  allocator.deallocate(p);
  CHECK(allocator.allocate(600) == p);
  allocator.deallocate(p);

  allocator.release_cached();
  const CudaAllocatorStats released = allocator.stats();
  CHECK(released.bytes_reserved == 0);
  CHECK(released.cuda_free_calls == released.cuda_malloc_calls);
  CHECK(allocator.allocate(0) == nullptr);
}

TEST_CASE("cuda allocator reports out-of-memory with the request and the device's memory", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  CachingAllocator allocator(0);
  void* cached = allocator.allocate(size_t{8} << 20);
  void* held = allocator.allocate(4096);
  allocator.deallocate(cached);
  REQUIRE(allocator.stats().bytes_reserved > allocator.stats().bytes_in_use);

  const size_t impossible = size_t{1} << 50;  // 1 PiB
  const std::string message = error_message([&] { allocator.allocate(impossible); });
  INFO(message);
  CHECK(message.find("out of memory") != std::string::npos);
  CHECK(message.find(std::to_string(impossible) + " bytes") != std::string::npos);
  CHECK(message.find(" free of ") != std::string::npos);
  CHECK(message.find(" total") != std::string::npos);
  // The retry released the cache first; the block in use is untouched.
  const CudaAllocatorStats after = allocator.stats();
  CHECK(after.bytes_reserved == after.bytes_in_use);
  CHECK(after.bytes_in_use == CachingAllocator::round_size(4096));
  allocator.deallocate(held);

  const std::string absurd = error_message([&] { allocator.allocate(~size_t{0}); });
  CHECK(absurd.find("more than any device holds") != std::string::npos);
}

TEST_CASE("cuda allocator keeps a private pool's blocks to itself until it is released", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  CachingAllocator allocator(0);
  const size_t n = 4096, size = CachingAllocator::round_size(n);
  void* common = allocator.allocate(n);
  allocator.deallocate(common);  // cached in the common pool

  const CachingAllocator::PoolId pool = allocator.create_private_pool();
  void* first = nullptr;
  void* other_thread = nullptr;
  {
    PoolRouting routing(allocator, pool);
    first = allocator.allocate(n);
    CHECK(first != common);  // not from the common cache
    CHECK(allocator.stats().cuda_malloc_calls == 2);
    CHECK(allocator.stats().bytes_in_private_pools == size);
    allocator.deallocate(first);
    CHECK(allocator.allocate(n) == first);  // served again from the pool
    // Another thread is not routed: it gets the common block.
    std::thread([&] { other_thread = allocator.allocate(n); }).join();
    CHECK(other_thread == common);
    CHECK_THROWS_AS(PoolRouting(allocator, pool), Error);  // one routing per thread
  }
  allocator.deallocate(other_thread);
  // Freed after the routing ended, by another thread, the pool's block still goes back to
  // the pool: the common pool's requests do not get it.
  std::thread([&] { allocator.deallocate(first); }).join();
  CHECK(allocator.allocate(n) == common);
  void* fresh = allocator.allocate(n);
  CHECK(fresh != first);
  CHECK(allocator.stats().cuda_malloc_calls == 3);
  allocator.deallocate(fresh);
  allocator.deallocate(common);
  // release_cached() leaves the pool's blocks alone.
  allocator.release_cached();
  CHECK(allocator.stats().bytes_reserved == size);
  CHECK(allocator.stats().bytes_in_private_pools == size);

  allocator.release_private_pool(pool);
  CHECK(allocator.stats().bytes_in_private_pools == 0);
  CHECK(allocator.allocate(n) == first);  // now in the common cache
  allocator.deallocate(first);
  CHECK_THROWS_AS(allocator.release_private_pool(pool), Error);
  CHECK_THROWS_AS(allocator.release_private_pool(CachingAllocator::kCommonPool), Error);
  CHECK_THROWS_AS(PoolRouting(allocator, pool), Error);
}

TEST_CASE("cuda allocator: a private pool's block in use at its release joins the common pool", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  CachingAllocator allocator(0);
  const CachingAllocator::PoolId pool = allocator.create_private_pool();
  void* held = nullptr;
  {
    PoolRouting routing(allocator, pool);
    held = allocator.allocate(1000);
    CHECK_THROWS_AS(allocator.release_private_pool(pool), Error);  // still routed
  }
  allocator.release_private_pool(pool);
  CHECK(allocator.stats().bytes_in_private_pools == 0);
  allocator.deallocate(held);
  CHECK(allocator.allocate(1000) == held);
  allocator.deallocate(held);
}

TEST_CASE("cuda allocator serves a capture from its private pool and never frees during it", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  CachingAllocator allocator(0);
  void* cached = allocator.allocate(size_t{8} << 20);
  allocator.deallocate(cached);
  const CachingAllocator::PoolId pool = allocator.create_private_pool();
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  std::string message;
  void* block = nullptr;
  {
    PoolRouting routing(allocator, pool);
    // A cache miss calls cudaMalloc, which the capture allows in relaxed mode only.
    block = allocator.allocate(4096);
    // Out of memory fails without releasing the cache (cudaFree would break the capture).
    message = error_message([&] { allocator.allocate(size_t{1} << 50); });
  }
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  REQUIRE(cudaStreamIsCapturing(stream, &status) == cudaSuccess);
  CHECK(status == cudaStreamCaptureStatusActive);
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  INFO(message);
  CHECK(message.find("out of memory") != std::string::npos);
  CHECK(message.find("private pool") != std::string::npos);
  CHECK(allocator.stats().cuda_free_calls == 0);
  CHECK(allocator.stats().bytes_reserved ==
        (size_t{8} << 20) + CachingAllocator::round_size(4096));
  allocator.deallocate(block);
  allocator.release_private_pool(pool);
}

TEST_CASE("cuda allocator ignores a pointer it did not hand out", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  CachingAllocator allocator(0);
  void* p = allocator.allocate(100);
  const CudaAllocatorStats before = allocator.stats();
  int local = 0;
  allocator.deallocate(&local);  // reported on stderr
  const CudaAllocatorStats after = allocator.stats();
  CHECK(after.bytes_in_use == before.bytes_in_use);
  CHECK(after.bytes_reserved == before.bytes_reserved);
  allocator.deallocate(p);
  CHECK(allocator.stats().bytes_in_use == 0);
}

TEST_CASE("cuda tensors reach a steady state without cudaMalloc", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  auto step = [] {
    std::vector<Tensor> live;
    for (int64_t n : {1, 7, 1023, 4097, 100000}) {
      live.push_back(Tensor::zeros({n}, DType::F32, gpu()));
      live.push_back(Tensor::zeros({n, 3}, DType::F16, gpu()));
    }
    gpu_backend().unary(UnaryOp::Exp, live[6], live[6]);
  };
  step();
  const CudaAllocatorStats warm = cuda_allocator_stats();
  for (int i = 0; i < 3; ++i) step();
  const CudaAllocatorStats steady = cuda_allocator_stats();
  CHECK(steady.cuda_malloc_calls == warm.cuda_malloc_calls);
  CHECK(steady.allocations > warm.allocations);
}

TEST_CASE("cuda copies round-trip and count host synchronisations", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  CudaBackend& backend = cuda_backend();
  std::vector<float> host(4097);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i) * 0.25f - 7.0f;
  void* device = backend.allocate(host.size() * sizeof(float));

  const uint64_t before = backend.host_syncs();
  backend.copy_from_host(device, host.data(), host.size() * sizeof(float));
  CHECK(backend.host_syncs() == before);  // queued, not waited for
  std::vector<float> back(host.size(), -1.0f);
  backend.copy_to_host(back.data(), device, back.size() * sizeof(float));
  CHECK(backend.host_syncs() == before + 1);
  CHECK(back == host);
  backend.synchronize();
  CHECK(backend.host_syncs() == before + 2);
  CHECK(cuda_host_syncs() == backend.host_syncs());
  backend.deallocate(device, host.size() * sizeof(float));

  // A launch waits for nothing; a check that returns a value reads it back once.
  Tensor x = Tensor::from_vector(host, {4097}, DType::F32, gpu());
  const uint64_t launched = backend.host_syncs();
  backend.affine(x, 2.0f, 1.0f, x);
  CHECK(backend.host_syncs() == launched);
  CHECK(backend.all_finite(x));
  CHECK(backend.host_syncs() == launched + 1);
}

TEST_CASE("cuda primitives reject tensors on another device", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  Tensor host = Tensor::zeros({7}, DType::F32);
  Tensor device = Tensor::zeros({7}, DType::F32, gpu());
  const std::string message = error_message([&] { gpu_backend().unary(UnaryOp::Exp, host, device); });
  INFO(message);
  CHECK(message.find("unary") != std::string::npos);
  CHECK(message.find("is not on cuda:0") != std::string::npos);
}

TEST_CASE("cuda backend creates its library handles once", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  CudaBackend& backend = cuda_backend();
  cublasLtHandle_t lt = backend.cublaslt_handle();
  CHECK(lt != nullptr);
  CHECK(backend.cublaslt_handle() == lt);
  cudnnHandle_t dnn = backend.cudnn_handle();
  CHECK(dnn != nullptr);
  CHECK(backend.cudnn_handle() == dnn);
  cudaStream_t bound = nullptr;
  REQUIRE(cudnnGetStream(dnn, &bound) == CUDNN_STATUS_SUCCESS);
  CHECK(bound == backend.stream());
}
