// Host-to-device uploads through the pinned ring (cuda/pinned_upload.h): the ring's placement
// and retirement worked out by hand, bytes that arrive exactly however often the ring wraps,
// the direct path for uploads that do not fit or when no pinned memory can be had, and the
// backend's copy_from_host going through the ring.
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend_agreement.h"
#include "core/error.h"
#include "cuda/cuda_backend.h"
#include "cuda/pinned_upload.h"
#include "cuda_backend_access.h"
#include "tests/error_message.h"

#if MIXPREC_CUDA_EMULATION
#include "cuda/emulation/runtime_emulation.h"
#endif

namespace {

using namespace mixprec;
using namespace mixprec::cuda_test;

using mixprec_test::error_message;

std::vector<uint64_t> ids_in_flight(const UploadRegions& regions) {
  std::vector<uint64_t> ids;
  for (const UploadRegions::Region& region : regions.in_flight()) ids.push_back(region.id);
  return ids;
}

// Device memory of the backend, freed at scope exit.
class DeviceBytes {
 public:
  explicit DeviceBytes(size_t n) : n_(n), ptr_(static_cast<unsigned char*>(cuda_backend().allocate(n))) {}
  ~DeviceBytes() { cuda_backend().deallocate(ptr_, n_); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;

  unsigned char* get() const { return ptr_; }
  // Waits for the stream, then reads every byte back.
  std::vector<unsigned char> read() const {
    std::vector<unsigned char> host(n_, 0);
    cuda_backend().copy_to_host(host.data(), ptr_, n_);
    return host;
  }

 private:
  size_t n_;
  unsigned char* ptr_;
};

}  // namespace

TEST_CASE("upload regions follow one another and wrap to the start", "[cuda][pinned_upload]") {
  UploadRegions regions(1000);
  CHECK(regions.capacity() == 1000);
  std::vector<uint64_t> retired;
  auto retire = [&](const UploadRegions::Region& r) { retired.push_back(r.id); };
  CHECK(regions.place(1, 1, retire) == 0);
  CHECK(regions.place(7, 2, retire) == 1);
  CHECK(regions.place(100, 3, retire) == 8);
  CHECK(regions.place(256, 4, retire) == 108);
  CHECK(regions.place(636, 5, retire) == 364);  // ends exactly at the capacity: no wrap
  CHECK(retired.empty());
  CHECK(ids_in_flight(regions) == std::vector<uint64_t>{1, 2, 3, 4, 5});
  const UploadRegions::Region& last = regions.in_flight().back();
  CHECK(last.begin == 364);
  CHECK(last.end == 1000);
  // The next region cannot start at 1000: it starts at 0 and overlaps the first two.
  CHECK(regions.place(8, 6, retire) == 0);
  CHECK(retired == std::vector<uint64_t>{1, 2});
  CHECK(ids_in_flight(regions) == std::vector<uint64_t>{3, 4, 5, 6});
}

TEST_CASE("upload regions retire exactly the overlapping regions, oldest first",
          "[cuda][pinned_upload]") {
  // Capacity 100. Each step: size, the offset it gets, the regions it retires (worked out by
  // hand from the intervals written beside them) and what stays in flight.
  UploadRegions regions(100);
  std::vector<uint64_t> retired;
  auto place = [&](size_t n, uint64_t id) {
    retired.clear();
    return regions.place(n, id, [&](const UploadRegions::Region& r) { retired.push_back(r.id); });
  };
  using Ids = std::vector<uint64_t>;

  CHECK(place(40, 1) == 0);  // 1 = [0, 40)
  CHECK(retired.empty());
  CHECK(place(40, 2) == 40);  // 2 = [40, 80)
  CHECK(retired.empty());
  CHECK(place(30, 3) == 0);  // 80 + 30 > 100: 3 = [0, 30), overlaps 1
  CHECK(retired == Ids{1});
  CHECK(place(30, 4) == 30);  // 4 = [30, 60), overlaps 2
  CHECK(retired == Ids{2});
  CHECK(place(30, 5) == 60);  // 5 = [60, 90)
  CHECK(retired.empty());
  CHECK(ids_in_flight(regions) == Ids{3, 4, 5});
  CHECK(place(20, 6) == 0);  // 90 + 20 > 100: 6 = [0, 20), overlaps 3 = [0, 30) only
  CHECK(retired == Ids{3});
  CHECK(place(50, 7) == 20);  // 7 = [20, 70), overlaps 4 = [30, 60) and 5 = [60, 90)
  CHECK(retired == Ids{4, 5});
  CHECK(place(20, 8) == 70);  // 8 = [70, 90)
  CHECK(retired.empty());
  CHECK(ids_in_flight(regions) == Ids{6, 7, 8});

  // 6 has completed: dropped without a retire.
  CHECK(regions.drop_completed([](const UploadRegions::Region& r) { return r.id == 6; }) == 1);
  CHECK(ids_in_flight(regions) == Ids{7, 8});
  CHECK(place(15, 9) == 0);  // 90 + 15 > 100: 9 = [0, 15), overlaps nothing in flight
  CHECK(retired.empty());
  CHECK(place(40, 10) == 15);  // 10 = [15, 55), overlaps 7 = [20, 70)
  CHECK(retired == Ids{7});
  CHECK(ids_in_flight(regions) == Ids{8, 9, 10});
  // 55 + 50 > 100: 11 = [0, 50) overlaps 9 and 10 but not the oldest, 8 = [70, 90), which
  // stays in flight ahead of it.
  CHECK(place(50, 11) == 0);
  CHECK(retired == Ids{9, 10});
  CHECK(ids_in_flight(regions) == Ids{8, 11});
  CHECK(place(40, 12) == 50);  // 12 = [50, 90), overlaps 8
  CHECK(retired == Ids{8});
  // A region of the whole capacity retires everything in flight, oldest first.
  CHECK(place(100, 13) == 0);
  CHECK(retired == Ids{11, 12});
  CHECK(ids_in_flight(regions) == Ids{13});
  CHECK(place(1, 14) == 0);  // 100 + 1 > 100
  CHECK(retired == Ids{13});
  CHECK(ids_in_flight(regions) == Ids{14});
}

TEST_CASE("upload regions drop completed regions only up to the first one still running",
          "[cuda][pinned_upload]") {
  UploadRegions regions(100);
  auto none = [](const UploadRegions::Region&) { FAIL("nothing overlaps"); };
  for (uint64_t id = 1; id <= 4; ++id) regions.place(20, id, none);
  std::vector<uint64_t> asked;
  // 1 and 2 are done, 3 is not, 4 is: the queue keeps 3 and 4, and 4 is never asked about.
  const size_t dropped = regions.drop_completed([&](const UploadRegions::Region& r) {
    asked.push_back(r.id);
    return r.id != 3;
  });
  CHECK(dropped == 2);
  CHECK(asked == std::vector<uint64_t>{1, 2, 3});
  CHECK(ids_in_flight(regions) == std::vector<uint64_t>{3, 4});
  // Dropping frees no space ahead of the head: the next region still follows the last one.
  CHECK(regions.place(20, 5, none) == 80);

  UploadRegions empty(10);
  CHECK(empty.drop_completed([](const UploadRegions::Region&) { return true; }) == 0);
}

TEST_CASE("upload regions reject empty and oversized regions and a zero capacity",
          "[cuda][pinned_upload]") {
  UploadRegions regions(64);
  auto retire = [](const UploadRegions::Region&) {};
  std::string message = error_message([&] { regions.place(0, 1, retire); });
  CHECK(message.find("0 bytes") != std::string::npos);
  message = error_message([&] { regions.place(65, 1, retire); });
  CHECK(message.find("65 bytes") != std::string::npos);
  CHECK(message.find("64 bytes") != std::string::npos);
  CHECK(regions.in_flight().empty());
  CHECK(regions.place(64, 1, retire) == 0);  // the whole ring is allowed

  message = error_message([] { UploadRegions zero(0); });
  CHECK(message.find("capacity") != std::string::npos);
  CHECK_THROWS_AS(PinnedUploadRing(0), Error);
}

TEST_CASE("upload regions keep a region in flight when its retire throws",
          "[cuda][pinned_upload]") {
  UploadRegions regions(100);
  regions.place(60, 1, [](const UploadRegions::Region&) {});
  regions.place(30, 2, [](const UploadRegions::Region&) {});
  CHECK_THROWS_AS(regions.place(50, 3,
                                [](const UploadRegions::Region&) {
                                  throw std::runtime_error("wait failed");
                                }),
                  std::runtime_error);
  CHECK(ids_in_flight(regions) == std::vector<uint64_t>{1, 2});
  // The head did not move: the next region still wraps (90 + 20 > 100) and retires 1.
  std::vector<uint64_t> retired;
  CHECK(regions.place(20, 4, [&](const UploadRegions::Region& r) { retired.push_back(r.id); }) == 0);
  CHECK(retired == std::vector<uint64_t>{1});
}

TEST_CASE("pinned ring uploads arrive exactly while the ring wraps many times",
          "[cuda][pinned_upload]") {
  MIXPREC_REQUIRE_CUDA();
  CudaBackend& backend = cuda_backend();
  constexpr size_t kCapacity = 4096;
  constexpr int kUploads = 300;
  std::mt19937 rng(20240611);
  std::uniform_int_distribution<size_t> size_dist(1, 3000);
  std::uniform_int_distribution<int> byte_dist(0, 255);

  std::vector<size_t> sizes(kUploads);
  size_t total = 0;
  for (size_t& n : sizes) {
    n = size_dist(rng);
    total += n;
  }
  REQUIRE(total > 50 * kCapacity);  // the ring wraps dozens of times
  DeviceBytes device(total);
  std::vector<unsigned char> expected(total);

  PinnedUploadRing ring(kCapacity);
  CHECK(ring.capacity() == kCapacity);
  std::vector<unsigned char> source(3000);
  size_t at = 0;
  for (size_t n : sizes) {
    for (size_t i = 0; i < n; ++i) source[i] = static_cast<unsigned char>(byte_dist(rng));
    std::memcpy(expected.data() + at, source.data(), n);
    ring.upload(device.get() + at, source.data(), n, backend.stream());
    // The caller may reuse its buffer at once: what arrives is what was there at the call.
    std::memset(source.data(), 0xA5, source.size());
    at += n;
  }
  CHECK(ring.staged_uploads() == kUploads);
  CHECK(ring.direct_uploads() == 0);
  CHECK(ring.waits() <= static_cast<uint64_t>(kUploads));
#if MIXPREC_CUDA_EMULATION
  // Emulated streams finish their work before the call returns: no region is ever waited for.
  CHECK(ring.waits() == 0);
#endif
  const std::vector<unsigned char> arrived = device.read();
  size_t mismatches = 0;
  for (size_t i = 0; i < total; ++i) mismatches += arrived[i] != expected[i];
  CHECK(mismatches == 0);
}

TEST_CASE("pinned ring sends uploads larger than its capacity directly", "[cuda][pinned_upload]") {
  MIXPREC_REQUIRE_CUDA();
  CudaBackend& backend = cuda_backend();
  constexpr size_t kCapacity = 4096;
  PinnedUploadRing ring(kCapacity);
  DeviceBytes device(kCapacity + 5000);
  std::vector<unsigned char> big(5000), whole(kCapacity);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<unsigned char>(i * 7 + 3);
  for (size_t i = 0; i < whole.size(); ++i) whole[i] = static_cast<unsigned char>(i * 13 + 1);

  ring.upload(device.get(), big.data(), big.size(), backend.stream());
  CHECK(ring.direct_uploads() == 1);
  CHECK(ring.staged_uploads() == 0);
  // Exactly the capacity still fits the ring.
  ring.upload(device.get() + big.size(), whole.data(), whole.size(), backend.stream());
  CHECK(ring.direct_uploads() == 1);
  CHECK(ring.staged_uploads() == 1);
  // Nothing to copy: no counter moves, and no pointer is touched.
  ring.upload(nullptr, nullptr, 0, backend.stream());
  CHECK(ring.direct_uploads() == 1);
  CHECK(ring.staged_uploads() == 1);

  const std::vector<unsigned char> arrived = device.read();
  CHECK(std::vector<unsigned char>(arrived.begin(), arrived.begin() + 5000) == big);
  CHECK(std::vector<unsigned char>(arrived.begin() + 5000, arrived.end()) == whole);
}

TEST_CASE("pinned ring goes directly when no pinned memory can be allocated",
          "[cuda][pinned_upload]") {
  MIXPREC_REQUIRE_CUDA();
  CudaBackend& backend = cuda_backend();
  // No host has 2^60 bytes to pin: the allocation fails on the first upload, and every upload
  // then goes directly without trying again.
  PinnedUploadRing ring(size_t{1} << 60);
  DeviceBytes device(200);
  std::vector<unsigned char> bytes(200);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(255 - i);
  ring.upload(device.get(), bytes.data(), 100, backend.stream());
  CHECK(cudaGetLastError() == cudaSuccess);  // the failed allocation left no error behind
  ring.upload(device.get() + 100, bytes.data() + 100, 100, backend.stream());
  CHECK(ring.direct_uploads() == 2);
  CHECK(ring.staged_uploads() == 0);
  CHECK(device.read() == bytes);
}

TEST_CASE("pinned ring leaves an earlier pending CUDA error for its own check",
          "[cuda][pinned_upload]") {
  MIXPREC_REQUIRE_CUDA();
  CudaBackend& backend = cuda_backend();
  constexpr size_t kCapacity = 4096;
  PinnedUploadRing ring(kCapacity);
  DeviceBytes device(1000 + kCapacity);
  std::vector<unsigned char> first(1000, 0x11), second(kCapacity);
  for (size_t i = 0; i < second.size(); ++i) second[i] = static_cast<unsigned char>(i % 251);
  ring.upload(device.get(), first.data(), first.size(), backend.stream());
  REQUIRE(ring.staged_uploads() == 1);

  // An error some earlier call left for the next check (as a launch would).
  REQUIRE(cudaSetDevice(1 << 20) != cudaSuccess);
  REQUIRE(cudaPeekAtLastError() == cudaErrorInvalidDevice);
  // The whole ring overlaps the first region. With an error pending the ring cannot ask
  // whether that region is done without replacing the error, so it waits for it (one wait).
  ring.upload(device.get() + 1000, second.data(), second.size(), backend.stream());
  CHECK(ring.staged_uploads() == 2);
  CHECK(ring.waits() == 1);
  CHECK(cudaGetLastError() == cudaErrorInvalidDevice);  // still there for its check
  CHECK(cudaGetLastError() == cudaSuccess);

  const std::vector<unsigned char> arrived = device.read();
  CHECK(std::vector<unsigned char>(arrived.begin(), arrived.begin() + 1000) == first);
  CHECK(std::vector<unsigned char>(arrived.begin() + 1000, arrived.end()) == second);
}

TEST_CASE("cuda copy_from_host and Tensor::to go through the pinned ring",
          "[cuda][pinned_upload]") {
  MIXPREC_REQUIRE_CUDA();
  CudaBackend& backend = cuda_backend();
  std::mt19937 rng(7);
  const Tensor values = random_tensor({37, 11}, DType::F16, rng, -100.0f, 100.0f);
  std::vector<int32_t> id_values(301);
  for (size_t i = 0; i < id_values.size(); ++i) id_values[i] = static_cast<int32_t>(i * 2654435761u % 50257);
  const Tensor ids = Tensor::from_ints(id_values, {301});

  const uint64_t staged = backend.upload_ring().staged_uploads();
  const uint64_t syncs = backend.host_syncs();
  const uint64_t waits = backend.upload_ring().waits();
  const Tensor values_gpu = values.to(gpu());
  const Tensor ids_gpu = ids.to(gpu());
  CHECK(backend.upload_ring().staged_uploads() == staged + 2);
  // Uploads count as host syncs only when the ring had to wait.
  CHECK(backend.host_syncs() == syncs + (backend.upload_ring().waits() - waits));

  const Tensor values_back = values_gpu.to(kCPU);
  const Tensor ids_back = ids_gpu.to(kCPU);
  REQUIRE(values_back.nbytes() == values.nbytes());
  CHECK(std::memcmp(values_back.data(), values.data(), values.nbytes()) == 0);
  CHECK(ids_back.to_int_vector() == id_values);
}

#if MIXPREC_CUDA_EMULATION
TEST_CASE("emulated pinned memory and event queries behave as the runtime's",
          "[cuda][pinned_upload]") {
  cudaGetLastError();
  void* host = reinterpret_cast<void*>(1);
  CHECK(cudaHostAlloc(&host, 64, 0x80) == cudaErrorInvalidValue);
  CHECK(host == nullptr);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaHostAlloc(nullptr, 64, cudaHostAllocDefault) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  // More than can be pinned: refused before any host memory is asked for.
  CHECK(cudaHostAlloc(&host, mixprec::emulation::kEmulatedPinnedBytes + 1,
                      cudaHostAllocDefault) == cudaErrorMemoryAllocation);
  CHECK(host == nullptr);
  CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
  REQUIRE(cudaHostAlloc(&host, 1000, cudaHostAllocDefault) == cudaSuccess);
  REQUIRE(host != nullptr);
  CHECK(reinterpret_cast<uintptr_t>(host) % 4096 == 0);

  // Pinned memory is host memory to a copy: H2D from it passes the checks, and back.
  void* device = nullptr;
  REQUIRE(cudaMalloc(&device, 1000) == cudaSuccess);
  std::memset(host, 0x3C, 1000);
  CHECK(cudaMemcpyAsync(device, host, 1000, cudaMemcpyHostToDevice, nullptr) == cudaSuccess);
  std::vector<unsigned char> back(1000, 0);
  CHECK(cudaMemcpy(back.data(), device, 1000, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(back == std::vector<unsigned char>(1000, 0x3C));
  // ... and not device memory: a device copy into it is refused.
  CHECK(cudaMemcpy(host, device, 1000, cudaMemcpyDeviceToDevice) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  // cudaFreeHost takes only what cudaHostAlloc gave.
  CHECK(cudaFreeHost(device) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaFree(device) == cudaSuccess);
  CHECK(cudaFreeHost(host) == cudaSuccess);
  CHECK(cudaFreeHost(nullptr) == cudaSuccess);

  cudaEvent_t event = nullptr;
  CHECK(cudaEventCreateWithFlags(&event, 0x40) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  REQUIRE(cudaEventCreateWithFlags(&event, cudaEventDisableTiming) == cudaSuccess);
  CHECK(cudaEventQuery(event) == cudaSuccess);  // never recorded: marks no work
  CHECK(cudaEventRecord(event, nullptr) == cudaSuccess);
  CHECK(cudaEventQuery(event) == cudaSuccess);
  CHECK(cudaEventDestroy(event) == cudaSuccess);
  CHECK(cudaEventQuery(nullptr) == cudaErrorInvalidResourceHandle);
  CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
  CHECK(std::string(cudaGetErrorName(cudaErrorNotReady)) == "cudaErrorNotReady");
}
#endif
