// GPU faults: an out-of-memory names the request, the device's free and total memory and
// the allocator's reserved and in-use bytes, and the process goes on; a CUDA error names the
// op (the function that made the call) and, for a launch, the kernel. The checks run on
// every machine; the allocator and kernel cases need a device and are skipped without one.
#include <bit>
#include <cstdint>
#include <string>

#include "backend_agreement.h"
#include "core/error.h"
#include "cuda/caching_allocator.h"
#include "cuda/cuda_check.h"
#include "cuda/kernels/fill.h"
#include "tests/error_message.h"

namespace {

using namespace mixprec;
using namespace mixprec::cuda_test;

using mixprec_test::error_message;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A named function for the messages to name.
void copy_with_a_bad_argument() { CUDA_CHECK(cudaErrorInvalidValue); }

void read_after_a_faulty_kernel() { CUDA_CHECK(cudaErrorIllegalAddress); }

// A failed runtime call leaves its status as the thread's last error, which the next launch
// check reports as that launch's failure.
void launch_after_a_failed_call() {
  const cudaError_t failed = cudaSetDevice(1 << 20);  // no such device anywhere
  REQUIRE(failed != cudaSuccess);
  CUDA_CHECK_LAST("probe_kernel");
}

}  // namespace

TEST_CASE("CUDA errors name the function that made the call", "[cuda_check]") {
  const std::string copy = error_message(copy_with_a_bad_argument);
  INFO(copy);
  CHECK(contains(copy, "cudaErrorInvalidValue (invalid argument) in `cudaErrorInvalidValue` in "
                       "copy_with_a_bad_argument at test_cuda_faults.cpp:"));
  CHECK_FALSE(contains(copy, "CUDA_LAUNCH_BLOCKING"));

  // A kernel's fault surfaces at a later call: the message says so and how to find it.
  const std::string late = error_message(read_after_a_faulty_kernel);
  INFO(late);
  CHECK(contains(late, "cudaErrorIllegalAddress"));
  CHECK(contains(late, "in read_after_a_faulty_kernel at"));
  CHECK(contains(late, "CUDA_LAUNCH_BLOCKING=1"));

  // A launch check names the kernel given to it and the op around it.
  const std::string launch = error_message(launch_after_a_failed_call);
  INFO(launch);
  CHECK(contains(launch, "in the launch of probe_kernel in launch_after_a_failed_call at "
                         "test_cuda_faults.cpp:"));
  // The check cleared the status it reported (without a driver, the runtime's failure to
  // start is reported again by every call).
  if (cuda_device_count() > 0) CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("function_name reduces each compiler's spelling to the op's name", "[cuda_check]") {
  using mixprec::detail::function_name;
  // GCC, inside the dtype dispatch's lambdas.
  CHECK(function_name("mixprec::kernels::layer_norm(mixprec::DType, const void*, float)::"
                      "<lambda()>::<lambda(auto:3)> [with auto:3 = std::integral_constant<int, 4>]") ==
        "kernels::layer_norm");
  // nvcc's front end names anonymous namespaces _GLOBAL__N__<hash>.
  CHECK(function_name("void mixprec::kernels::_GLOBAL__N__8dcf52f6_4_fill_cu_3a7fd97a::"
                      "launch_fill_bits(U*, U, int64_t, cudaStream_t) [with U = short unsigned int]") ==
        "kernels::launch_fill_bits");
  CHECK(function_name("void mixprec::{anonymous}::use_device(int)") == "use_device");
  CHECK(function_name("void* mixprec::(anonymous namespace)::grab(size_t)") == "grab");
  CHECK(function_name("void mixprec::CudaBackend::copy_to_host(void*, const void*, size_t) const") ==
        "CudaBackend::copy_to_host");
  CHECK(function_name("std::vector<int, std::allocator<int> > mixprec::cuda::sizes(int)") ==
        "cuda::sizes");
  CHECK(function_name("void Functor::operator()(int) const") == "Functor::operator()");
  CHECK(function_name("main") == "main");
  CHECK(function_name(nullptr).empty());
}

TEST_CASE("a real kernel's launch check names its op", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  Tensor out = Tensor::empty({16}, DType::F32, gpu());
  // A stale status from a failed call makes the next launch check fail, which is how a bad
  // launch would look to it; the message must name the launcher, also from inside the dtype
  // dispatch's lambda in a file that nvcc compiled.
  REQUIRE(cudaSetDevice(1 << 20) != cudaSuccess);
  const std::string plain = error_message([&] {
    kernels::fill_f32(static_cast<float*>(out.data()), 1.0f, 16, nullptr);
  });
  INFO(plain);
  CHECK(contains(plain, "in a kernel launch in kernels::fill_f32 at fill.cu:"));
  REQUIRE(cudaSetDevice(1 << 20) != cudaSuccess);
  const std::string dispatched = error_message([&] {
    kernels::arange(out.data(), DType::F32, 0.0, 1.0, 16, nullptr);
  });
  INFO(dispatched);
  CHECK(contains(dispatched, "in a kernel launch in kernels::arange at fill.cu:"));
  // The device is still usable.
  gpu_backend().synchronize();
  CHECK(out.to(kCPU).defined());
}

TEST_CASE("an absurd allocation throws with the sizes and the process goes on", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  CachingAllocator allocator(0);
  void* cached = allocator.allocate(size_t{8} << 20);
  void* held = allocator.allocate(4096);
  allocator.deallocate(cached);
  const size_t held_size = CachingAllocator::round_size(4096);
  REQUIRE(held_size == 4096);  // 4096 is a class of its own (4096 + k * 1024)

  size_t free_before = 0, total = 0;
  REQUIRE(cudaMemGetInfo(&free_before, &total) == cudaSuccess);
  const size_t impossible = size_t{1} << 50;  // 1 PiB
  const std::string message = error_message([&] { allocator.allocate(impossible); });
  INFO(message);
  CHECK(contains(message, "cuda:0: out of memory allocating 1125899906842624 bytes (1.0 PiB)"));
  // The device's total is fixed; its free memory moves with other processes, so only its
  // place in the message is checked.
  CHECK(contains(message, " free of " + std::to_string(total) + " bytes"));
  // The cache (8 MiB) was released before the retry; the block in use stays reserved.
  CHECK(contains(message, "the caching allocator has 4096 bytes (4.0 KiB) reserved, "
                          "4096 bytes (4.0 KiB) in use by tensors, and released 8388608 bytes "
                          "(8.0 MiB) of cached blocks"));
  CHECK(contains(message, "train.batch_size"));

  // The process goes on: ordinary allocations succeed, through this allocator and through
  // tensors on the device.
  void* again = allocator.allocate(size_t{1} << 20);
  CHECK(again != nullptr);
  CHECK(allocator.stats().bytes_in_use == held_size + (size_t{1} << 20));
  allocator.deallocate(again);
  allocator.deallocate(held);
  CHECK(allocator.stats().bytes_in_use == 0);
  Tensor x = Tensor::from_vector({1.0f, 2.0f, 3.0f}, {3}, DType::F32, gpu());
  CHECK(x.to(kCPU).to_float_vector() == std::vector<float>{1.0f, 2.0f, 3.0f});
}

TEST_CASE("an out-of-memory through a tensor is a mixprec::Error", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  // 2^48 floats: 1 PiB, through the backend's allocator as a training step would ask for it.
  const std::string message =
      error_message([] { Tensor::empty({int64_t{1} << 48}, DType::F32, gpu()); });
  INFO(message);
  CHECK(contains(message, "out of memory allocating 1125899906842624 bytes"));
  CHECK(contains(message, " reserved, "));
  CHECK(contains(message, " in use by tensors"));
  Tensor y = Tensor::zeros({1024}, DType::F32, gpu());
  CHECK(y.to(kCPU).to_float_vector() == std::vector<float>(1024, 0.0f));
}
