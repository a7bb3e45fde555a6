// A test's window onto the kernel profile (cuda/kernel_profile.h).
#pragma once

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

}  // namespace mixprec::cuda_test
