// The emulated CUDA runtime (cuda/emulation/runtime_emulation.h) and the emulated
// cub::DeviceRadixSort (cuda/emulation/radix_sort_emulation.h): allocations are poisoned and
// bounded, copies are checked against the allocation they touch, errors are recorded for
// cudaGetLastError() as the real runtime does, and the sort is stable. Other tests of this
// program may hold device memory (the caching allocator keeps blocks), so the checks on
// memory use compare before and after instead of expecting zero.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "cuda/emulation/radix_sort_emulation.h"
#include "cuda/emulation/runtime_emulation.h"

namespace {

using mixprec::emulation::kEmulatedDeviceBytes;
using mixprec::emulation::live_allocations;
using mixprec::emulation::live_bytes;

// A device allocation freed at scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    REQUIRE(cudaMalloc(&ptr_, bytes) == cudaSuccess);
    REQUIRE(ptr_ != nullptr);
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  unsigned char* bytes() const { return static_cast<unsigned char*>(ptr_); }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t size() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

std::vector<unsigned char> download(const DeviceBuffer& buffer) {
  std::vector<unsigned char> host(buffer.size(), 0);
  REQUIRE(cudaMemcpy(host.data(), buffer.bytes(), buffer.size(), cudaMemcpyDeviceToHost) ==
          cudaSuccess);
  return host;
}

}  // namespace

TEST_CASE("emulated cudaMalloc fills new memory with 0xFF and counts it live", "[cuda_emulation]") {
  const size_t allocations = live_allocations(), bytes = live_bytes();
  {
    DeviceBuffer buffer(1000);
    CHECK(live_allocations() == allocations + 1);
    CHECK(live_bytes() == bytes + 1000);
    const std::vector<unsigned char> host = download(buffer);
    CHECK(std::all_of(host.begin(), host.end(), [](unsigned char c) { return c == 0xFF; }));
    // 0xFF bytes are a NaN in float, so an unwritten element cannot pass for a number.
    float first = 0.0f;
    std::memcpy(&first, host.data(), sizeof first);
    CHECK(first != first);
  }
  CHECK(live_allocations() == allocations);
  CHECK(live_bytes() == bytes);

  void* none = reinterpret_cast<void*>(uintptr_t{1});
  CHECK(cudaMalloc(&none, 0) == cudaSuccess);
  CHECK(none == nullptr);
  CHECK(cudaMalloc(nullptr, 16) == cudaErrorInvalidValue);
  (void)cudaGetLastError();
}

TEST_CASE("emulated cudaFree refuses a pointer cudaMalloc did not return", "[cuda_emulation]") {
  (void)cudaGetLastError();
  const size_t allocations = live_allocations(), bytes = live_bytes();
  int on_the_stack = 0;
  CHECK(cudaFree(&on_the_stack) == cudaErrorInvalidValue);
  {
    DeviceBuffer buffer(64);
    CHECK(cudaFree(buffer.bytes() + 1) == cudaErrorInvalidValue);  // inside, not the start
    CHECK(live_allocations() == allocations + 1);
  }
  CHECK(cudaFree(nullptr) == cudaSuccess);
  CHECK(live_allocations() == allocations);
  CHECK(live_bytes() == bytes);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("emulated cudaMemcpyAsync round-trips host data through the device", "[cuda_emulation]") {
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, 0) == cudaSuccess);
  CHECK(stream != nullptr);
  std::vector<int32_t> source(300);
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<int32_t>(i * i) - 4000;
  const size_t bytes = source.size() * sizeof(int32_t);
  DeviceBuffer a(bytes), b(bytes);
  CHECK(cudaMemcpyAsync(a.bytes(), source.data(), bytes, cudaMemcpyHostToDevice, stream) ==
        cudaSuccess);
  CHECK(cudaMemcpyAsync(b.bytes(), a.bytes(), bytes, cudaMemcpyDeviceToDevice, stream) ==
        cudaSuccess);
  std::vector<int32_t> back(source.size(), 0);
  CHECK(cudaMemcpyAsync(back.data(), b.bytes(), bytes, cudaMemcpyDeviceToHost, stream) ==
        cudaSuccess);
  CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
  CHECK(back == source);
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);
}

TEST_CASE("emulated copies past the end of an allocation fail and touch nothing",
          "[cuda_emulation]") {
  (void)cudaGetLastError();
  DeviceBuffer buffer(40);
  REQUIRE(cudaMemset(buffer.bytes(), 0x11, 40) == cudaSuccess);

  std::vector<unsigned char> host(64, 0x5A);
  // One byte past the end, from the start and from an offset.
  CHECK(cudaMemcpyAsync(host.data(), buffer.bytes(), 41, cudaMemcpyDeviceToHost, nullptr) ==
        cudaErrorInvalidValue);
  CHECK(cudaMemcpy(host.data(), buffer.bytes() + 8, 33, cudaMemcpyDeviceToHost) ==
        cudaErrorInvalidValue);
  CHECK(std::all_of(host.begin(), host.end(), [](unsigned char c) { return c == 0x5A; }));
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaSuccess);

  // Writing one byte past the end leaves the allocation as it was.
  CHECK(cudaMemcpy(buffer.bytes() + 1, host.data(), 40, cudaMemcpyHostToDevice) ==
        cudaErrorInvalidValue);
  // A device pointer that is not in any allocation.
  CHECK(cudaMemcpy(host.data(), host.data() + 32, 8, cudaMemcpyDeviceToHost) ==
        cudaErrorInvalidValue);
  const std::vector<unsigned char> device = download(buffer);
  CHECK(std::all_of(device.begin(), device.end(), [](unsigned char c) { return c == 0x11; }));

  // The exact extent is fine.
  CHECK(cudaMemcpy(host.data(), buffer.bytes() + 8, 32, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(host[0] == 0x11);
  CHECK(host[31] == 0x11);
  CHECK(host[32] == 0x5A);
  (void)cudaGetLastError();
}

TEST_CASE("emulated cudaMalloc beyond the device's memory fails without allocating",
          "[cuda_emulation]") {
  (void)cudaGetLastError();
  const size_t allocations = live_allocations(), bytes = live_bytes();
  void* p = reinterpret_cast<void*>(uintptr_t{1});
  CHECK(cudaMalloc(&p, kEmulatedDeviceBytes + 1) == cudaErrorMemoryAllocation);
  CHECK(p == nullptr);
  CHECK(live_allocations() == allocations);
  CHECK(live_bytes() == bytes);
  CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
  CHECK(cudaGetLastError() == cudaSuccess);

  // One byte more than is left, once something is live.
  DeviceBuffer held(4096);
  size_t free_bytes = 0, total_bytes = 0;
  REQUIRE(cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess);
  CHECK(cudaMalloc(&p, free_bytes + 1) == cudaErrorMemoryAllocation);
  CHECK(live_allocations() == allocations + 1);
  CHECK(live_bytes() == bytes + 4096);
  (void)cudaGetLastError();
}

TEST_CASE("emulated cudaMemGetInfo reports the device size less the live bytes",
          "[cuda_emulation]") {
  size_t free_bytes = 0, total_bytes = 0;
  REQUIRE(cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess);
  CHECK(total_bytes == kEmulatedDeviceBytes);
  CHECK(free_bytes + live_bytes() == total_bytes);
  {
    DeviceBuffer buffer(12345);
    size_t free_now = 0, total_now = 0;
    REQUIRE(cudaMemGetInfo(&free_now, &total_now) == cudaSuccess);
    CHECK(total_now == total_bytes);
    CHECK(free_now == free_bytes - 12345);
    CHECK(free_now + live_bytes() == total_now);
  }
  size_t free_after = 0;
  REQUIRE(cudaMemGetInfo(&free_after, &total_bytes) == cudaSuccess);
  CHECK(free_after == free_bytes);
}

TEST_CASE("emulated cudaMemset writes bytes inside its range only", "[cuda_emulation]") {
  (void)cudaGetLastError();
  DeviceBuffer buffer(64);
  CHECK(cudaMemset(buffer.bytes() + 10, 0x3C, 20) == cudaSuccess);
  CHECK(cudaMemsetAsync(buffer.bytes() + 40, 0x1A5, 2, nullptr) == cudaSuccess);  // low byte
  const std::vector<unsigned char> host = download(buffer);
  for (size_t i = 0; i < host.size(); ++i) {
    const unsigned char expected = i >= 10 && i < 30 ? 0x3C : i >= 40 && i < 42 ? 0xA5 : 0xFF;
    INFO("byte " << i);
    CHECK(host[i] == expected);
  }
  CHECK(cudaMemset(buffer.bytes(), 0, 40) == cudaSuccess);
  const std::vector<unsigned char> zeroed = download(buffer);
  for (size_t i = 0; i < zeroed.size(); ++i) {
    INFO("byte " << i);
    CHECK(zeroed[i] == (i < 40 ? 0x00 : i < 42 ? 0xA5 : 0xFF));
  }
  CHECK(cudaMemset(buffer.bytes() + 60, 0, 5) == cudaErrorInvalidValue);
  CHECK(download(buffer)[63] == 0xFF);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
}

TEST_CASE("emulated cudaGetLastError returns the last recorded error once", "[cuda_emulation]") {
  (void)cudaGetLastError();
  CHECK(cudaGetLastError() == cudaSuccess);
  int on_the_stack = 0;
  CHECK(cudaFree(&on_the_stack) == cudaErrorInvalidValue);
  CHECK(cudaSetDevice(1) == cudaErrorInvalidDevice);
  // A later success does not clear it; peeking does not either.
  { DeviceBuffer ok(8); }
  CHECK(cudaPeekAtLastError() == cudaErrorInvalidDevice);
  CHECK(cudaGetLastError() == cudaErrorInvalidDevice);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}

TEST_CASE("emulated runtime offers device 0 and no other", "[cuda_emulation]") {
  (void)cudaGetLastError();
  int count = 0;
  CHECK(cudaGetDeviceCount(&count) == cudaSuccess);
  CHECK(count == 1);
  CHECK(cudaSetDevice(1) == cudaErrorInvalidDevice);
  CHECK(cudaSetDevice(-1) == cudaErrorInvalidDevice);
  CHECK(cudaSetDevice(0) == cudaSuccess);
  int device = -1;
  CHECK(cudaGetDevice(&device) == cudaSuccess);
  CHECK(device == 0);
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 1) == cudaErrorInvalidDevice);
  CHECK(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
  CHECK(prop.totalGlobalMem == kEmulatedDeviceBytes);
  CHECK(prop.warpSize == 32);
  CHECK(prop.maxThreadsPerBlock == 1024);
  CHECK(cudaGetLastError() == cudaErrorInvalidDevice);
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("emulated cub radix sort sorts pairs stably by the chosen key bits", "[cuda_emulation]") {
  constexpr int kItems = 500;
  std::vector<uint32_t> keys(kItems);
  std::vector<int32_t> values(kItems);
  for (int i = 0; i < kItems; ++i) {
    // Few distinct keys, so that most keys repeat; some have bits above bit 4 set.
    keys[i] = static_cast<uint32_t>((i * 7919) % 13) + (i % 3 == 0 ? 0x40u : 0u);
    values[i] = i;
  }
  const size_t key_bytes = kItems * sizeof(uint32_t), value_bytes = kItems * sizeof(int32_t);
  DeviceBuffer keys_in(key_bytes), keys_out(key_bytes), values_in(value_bytes),
      values_out(value_bytes);
  REQUIRE(cudaMemcpy(keys_in.bytes(), keys.data(), key_bytes, cudaMemcpyHostToDevice) ==
          cudaSuccess);
  REQUIRE(cudaMemcpy(values_in.bytes(), values.data(), value_bytes, cudaMemcpyHostToDevice) ==
          cudaSuccess);

  // The size query: null storage, nothing read or written.
  size_t temp_bytes = 0;
  CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in.as<const uint32_t>(),
                                        keys_out.as<uint32_t>(), values_in.as<const int32_t>(),
                                        values_out.as<int32_t>(), kItems) == cudaSuccess);
  REQUIRE(temp_bytes > 0);
  CHECK(download(keys_out) == std::vector<unsigned char>(key_bytes, 0xFF));
  DeviceBuffer temp(temp_bytes);

  // The reference: std::stable_sort of (key, value) pairs by the key's bits [begin, end).
  const auto reference = [&](int begin_bit, int end_bit) {
    std::vector<std::pair<uint32_t, int32_t>> pairs(kItems);
    for (int i = 0; i < kItems; ++i) pairs[i] = {keys[i], values[i]};
    const auto field = [&](uint32_t k) {
      const uint64_t shifted = uint64_t{k} >> begin_bit;
      return shifted & ((uint64_t{1} << (end_bit - begin_bit)) - 1);
    };
    std::stable_sort(pairs.begin(), pairs.end(),
                     [&](const auto& a, const auto& b) { return field(a.first) < field(b.first); });
    return pairs;
  };
  const auto sorted = [&] {
    std::vector<uint32_t> k(kItems);
    std::vector<int32_t> v(kItems);
    REQUIRE(cudaMemcpy(k.data(), keys_out.bytes(), key_bytes, cudaMemcpyDeviceToHost) ==
            cudaSuccess);
    REQUIRE(cudaMemcpy(v.data(), values_out.bytes(), value_bytes, cudaMemcpyDeviceToHost) ==
            cudaSuccess);
    std::vector<std::pair<uint32_t, int32_t>> pairs(kItems);
    for (int i = 0; i < kItems; ++i) pairs[i] = {k[i], v[i]};
    return pairs;
  };

  SECTION("all 32 key bits") {
    CHECK(cub::DeviceRadixSort::SortPairs(temp.bytes(), temp_bytes, keys_in.as<const uint32_t>(),
                                          keys_out.as<uint32_t>(), values_in.as<const int32_t>(),
                                          values_out.as<int32_t>(), kItems) == cudaSuccess);
    const auto result = sorted();
    CHECK(result == reference(0, 32));
    // Stability spelled out: among equal keys the values (input positions) rise.
    for (int i = 1; i < kItems; ++i)
      if (result[i].first == result[i - 1].first) CHECK(result[i].second > result[i - 1].second);
  }
  SECTION("the low 4 bits only, as embedding_backward sorts ids below its vocabulary") {
    CHECK(cub::DeviceRadixSort::SortPairs(temp.bytes(), temp_bytes, keys_in.as<const uint32_t>(),
                                          keys_out.as<uint32_t>(), values_in.as<const int32_t>(),
                                          values_out.as<int32_t>(), kItems, 0, 4) == cudaSuccess);
    const auto result = sorted();
    CHECK(result == reference(0, 4));
    CHECK(result != reference(0, 32));  // the bits above 4 were ignored
  }
  SECTION("the input is left as it was") {
    CHECK(cub::DeviceRadixSort::SortPairs(temp.bytes(), temp_bytes, keys_in.as<const uint32_t>(),
                                          keys_out.as<uint32_t>(), values_in.as<const int32_t>(),
                                          values_out.as<int32_t>(), kItems, 2, 7) == cudaSuccess);
    CHECK(sorted() == reference(2, 7));
    std::vector<uint32_t> k(kItems);
    REQUIRE(cudaMemcpy(k.data(), keys_in.bytes(), key_bytes, cudaMemcpyDeviceToHost) ==
            cudaSuccess);
    CHECK(k == keys);
  }
}
