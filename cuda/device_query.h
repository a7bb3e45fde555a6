// Which CUDA devices this process can use, and which CUDA libraries it runs with.
// Safe to include anywhere: it includes no CUDA headers, and every function works (without
// throwing or crashing) on a machine with no NVIDIA driver or no GPU.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace mixprec {

struct CudaDeviceInfo {
  int index = 0;            // the CUDA device ordinal, as cudaSetDevice takes it
  std::string name;         // e.g. "NVIDIA H200"
  int major = 0;            // compute capability, e.g. 9.0 -> major 9, minor 0
  int minor = 0;
  size_t total_memory = 0;  // bytes of device memory
  int sm_count = 0;         // streaming multiprocessors
};

// Number of usable CUDA devices; 0 when there is no driver, no device, or the driver is too
// old for the runtime. Never throws.
int cuda_device_count();

// One entry per device, in ordinal order; empty when cuda_device_count() is 0. Throws
// mixprec::Error if a device that was counted cannot be queried.
std::vector<CudaDeviceInfo> cuda_devices();

// One human-readable line: the devices (or why there are none, with the CUDA status name and
// text), then the CUDA runtime, driver, cuBLAS and cuDNN versions in use. Never throws.
// e.g. "no CUDA device (cudaErrorNoDevice: no CUDA-capable device is detected); CUDA runtime
// 13.0, driver none, cuBLAS 13.0.2, cuDNN 9.19.0"
std::string cuda_status_line();

}  // namespace mixprec
