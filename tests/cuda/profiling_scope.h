// A test's window onto the kernel profile (cuda/kernel_profile.h).
#pragma once

#include <cstdint>
#include <string>

#include "cuda/kernel_profile.h"

namespace mixprec::cuda_test {

// Switches the kernel profile on for a scope, from an empty profile, and off again at its
// end, so that a test counts only its own launches.
class ProfilingScope {
 public:
  ProfilingScope() {
    reset_kernel_profile();
    set_kernel_profile(true);
  }
  ~ProfilingScope() {
    set_kernel_profile(false);
    reset_kernel_profile();
  }
  ProfilingScope(const ProfilingScope&) = delete;
  ProfilingScope& operator=(const ProfilingScope&) = delete;
};

// Launches in the profile of kernels whose name starts with `prefix` (a template's arguments
// follow it).
inline int64_t launches_of(const std::string& prefix) {
  int64_t calls = 0;
  for (const KernelProfileRow& row : kernel_profile())
    if (row.kernel.rfind(prefix, 0) == 0) calls += row.calls;
  return calls;
}

}  // namespace mixprec::cuda_test
