#include "cuda/device_query.h"

#include <cstdio>
#include <exception>

#include "cuda/cuda_check.h"

namespace mixprec {
namespace {

// The count together with the status that explains a zero.
struct DeviceCount {
  int count = 0;
  cudaError_t status = cudaSuccess;
};

DeviceCount query_device_count() {
  DeviceCount result;
  result.status = cudaGetDeviceCount(&result.count);
  if (result.status != cudaSuccess) {
    result.count = 0;
    // A failed runtime call also sets the thread's last error; clear it so that the next
    // CUDA_CHECK_LAST() does not report this harmless probe as a kernel launch failure.
    cudaGetLastError();
  }
  return result;
}

// CUDA encodes versions as 1000 * major + 10 * minor.
std::string cuda_version_text(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

std::string cublas_version_text() {
  int major = 0, minor = 0, patch = 0;
  if (cublasGetProperty(MAJOR_VERSION, &major) != CUBLAS_STATUS_SUCCESS ||
      cublasGetProperty(MINOR_VERSION, &minor) != CUBLAS_STATUS_SUCCESS ||
      cublasGetProperty(PATCH_LEVEL, &patch) != CUBLAS_STATUS_SUCCESS) {
    return "unknown";
  }
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

// cuDNN 9 encodes its version as 10000 * major + 100 * minor + patch.
std::string cudnn_version_text() {
  const size_t version = cudnnGetVersion();
  return std::to_string(version / 10000) + "." + std::to_string(version % 10000 / 100) + "." +
         std::to_string(version % 100);
}

std::string memory_text(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", static_cast<double>(bytes) / (1ull << 30));
  return text;
}

}  // namespace

int cuda_device_count() { return query_device_count().count; }

std::vector<CudaDeviceInfo> cuda_devices() {
  const int count = cuda_device_count();
  std::vector<CudaDeviceInfo> devices;
  devices.reserve(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, i));
    CudaDeviceInfo info;
    info.index = i;
    info.name = prop.name;
    info.major = prop.major;
    info.minor = prop.minor;
    info.total_memory = prop.totalGlobalMem;
    info.sm_count = prop.multiProcessorCount;
    devices.push_back(std::move(info));
  }
  return devices;
}

std::string cuda_status_line() {
  std::string line;
  const DeviceCount count = query_device_count();
  if (count.count == 0) {
    line = "no CUDA device";
    if (count.status != cudaSuccess) {
      line += std::string(" (") + cudaGetErrorName(count.status) + ": " +
              cudaGetErrorString(count.status) + ")";
    }
  } else {
    try {
      const std::vector<CudaDeviceInfo> devices = cuda_devices();
      line = std::to_string(devices.size()) + (devices.size() == 1 ? " CUDA device: " : " CUDA devices: ");
      for (size_t i = 0; i < devices.size(); ++i) {
        const CudaDeviceInfo& d = devices[i];
        if (i > 0) line += ", ";
        line += "#" + std::to_string(d.index) + " " + d.name + " (sm_" + std::to_string(d.major) +
                std::to_string(d.minor) + ", " + std::to_string(d.sm_count) + " SMs, " +
                memory_text(d.total_memory) + ")";
      }
    } catch (const std::exception& e) {
      line = std::to_string(count.count) + " CUDA device(s), not queryable: " + e.what();
    }
  }

  int runtime = 0;
  int driver = 0;
  cudaRuntimeGetVersion(&runtime);
  // Reports 0 when no driver is installed, which is itself worth printing.
  cudaDriverGetVersion(&driver);
  cudaGetLastError();
  line += "; CUDA runtime " + cuda_version_text(runtime) + ", driver " +
          (driver > 0 ? cuda_version_text(driver) : std::string("none")) + ", cuBLAS " +
          cublas_version_text() + ", cuDNN " + cudnn_version_text();
  return line;
}

}  // namespace mixprec
