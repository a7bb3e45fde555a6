// The CUDA backend skeleton: status checks, device discovery, and one kernel end to end.
// device_query.h comes first so that the check below sees only what it includes.
#include "cuda/device_query.h"

// Apps include device_query.h; it must keep CUDA headers out of their translation units.
#if defined(CUDART_VERSION) || defined(__CUDA_RUNTIME_API_H__) || defined(CUDNN_MAJOR)
#error "cuda/device_query.h must not include CUDA headers"
#endif

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/kernels/fill.h"
#include "tests/error_message.h"

using mixprec_test::error_message;

TEST_CASE("CUDA_CHECK throws with the status name, text, expression and file:line", "[cuda_check]") {
  const int line = __LINE__ + 1;
  const std::string message = error_message([] { CUDA_CHECK(cudaErrorInvalidValue); });
  INFO(message);
  CHECK(message.find("cudaErrorInvalidValue") != std::string::npos);
  CHECK(message.find("invalid argument") != std::string::npos);
  CHECK(message.find("test_cuda_skeleton.cpp:" + std::to_string(line)) != std::string::npos);
}

TEST_CASE("CUDA_CHECK evaluates its expression once and passes on success", "[cuda_check]") {
  int calls = 0;
  auto succeed = [&] {
    ++calls;
    return cudaSuccess;
  };
  CHECK_NOTHROW([&] { CUDA_CHECK(succeed()); }());
  CHECK(calls == 1);
}

TEST_CASE("CUBLAS_CHECK throws with the status name and file:line", "[cuda_check]") {
  const int line = __LINE__ + 1;
  const std::string message = error_message([] { CUBLAS_CHECK(CUBLAS_STATUS_INVALID_VALUE); });
  INFO(message);
  CHECK(message.find("cuBLAS") != std::string::npos);
  CHECK(message.find("CUBLAS_STATUS_INVALID_VALUE") != std::string::npos);
  CHECK(message.find("test_cuda_skeleton.cpp:" + std::to_string(line)) != std::string::npos);
  CHECK_NOTHROW([] { CUBLAS_CHECK(CUBLAS_STATUS_SUCCESS); }());
}

TEST_CASE("CUDNN_CHECK throws with the status name and file:line", "[cuda_check]") {
  const int line = __LINE__ + 1;
  const std::string message = error_message([] { CUDNN_CHECK(CUDNN_STATUS_BAD_PARAM); });
  INFO(message);
  CHECK(message.find("cuDNN") != std::string::npos);
  CHECK(message.find("CUDNN_STATUS_BAD_PARAM") != std::string::npos);
  CHECK(message.find("test_cuda_skeleton.cpp:" + std::to_string(line)) != std::string::npos);
  CHECK_NOTHROW([] { CUDNN_CHECK(CUDNN_STATUS_SUCCESS); }());
}

TEST_CASE("device discovery never throws, with or without a GPU", "[cuda_check]") {
  int count = -1;
  REQUIRE_NOTHROW(count = mixprec::cuda_device_count());
  CHECK(count >= 0);
  std::vector<mixprec::CudaDeviceInfo> devices;
  REQUIRE_NOTHROW(devices = mixprec::cuda_devices());
  CHECK(devices.size() == static_cast<size_t>(count));
  for (const auto& d : devices) {
    CHECK(d.major >= 1);
    CHECK(d.sm_count > 0);
    CHECK(d.total_memory > 0);
  }
  std::string line;
  REQUIRE_NOTHROW(line = mixprec::cuda_status_line());
  INFO(line);
  CHECK(line.find("cuBLAS ") != std::string::npos);
  CHECK(line.find("cuDNN 9.") != std::string::npos);
  if (count == 0) {
    CHECK(line.rfind("no CUDA device", 0) == 0);
  } else {
    CHECK(line.find(devices[0].name) != std::string::npos);
  }
}

TEST_CASE("fill_f32 writes every element, including a ragged tail", "[cuda]") {
  if (mixprec::cuda_device_count() == 0) {
    WARN("skipped: no CUDA device");
    return;
  }
  // Not a multiple of the block size, and larger than one grid pass would cover.
  constexpr size_t kCount = 4096 * 256 * 2 + 3;
  void* memory = nullptr;
  CUDA_CHECK(cudaMalloc(&memory, (kCount + 1) * sizeof(float)));
  float* device = static_cast<float*>(memory);
  std::vector<float> host(kCount + 1, 0.0f);
  try {
    CUDA_CHECK(cudaMemset(device, 0, (kCount + 1) * sizeof(float)));
    mixprec::kernels::fill_f32(device, 1.5f, kCount, nullptr);
    mixprec::kernels::fill_f32(device, -7.0f, 0, nullptr);  // n == 0 must write nothing
    CUDA_CHECK(cudaMemcpy(host.data(), device, host.size() * sizeof(float), cudaMemcpyDeviceToHost));
  } catch (...) {
    cudaFree(device);
    throw;
  }
  CUDA_CHECK(cudaFree(device));
  size_t wrong = 0;
  for (size_t i = 0; i < kCount; ++i) wrong += host[i] != 1.5f;
  CHECK(wrong == 0);
  CHECK(host[kCount] == 0.0f);  // one past the end stays untouched
}
