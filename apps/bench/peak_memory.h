// The peak memory of one run inside a longer process, for `mixprec bench`.
//
// Host (the CPU device): the kernel's resident-set high-water mark (VmHWM in
// /proc/self/status), restarted by writing "5" to /proc/self/clear_refs. Where that file
// cannot be written (a kernel without it, a sandbox), the peak is the whole process's
// (getrusage's ru_maxrss) and the result's note says so. Either way the figure is the
// process's resident set, so it includes what the process held before the run began.
//
// CUDA device: the caching allocator's peak of bytes in use (cuda/register.h), restarted at
// the current use by reset().
#pragma once

#include <cstdint>
#include <string>

namespace mixprec {

struct PeakMemory {
  double mib = 0.0;  // MiB (2^20 bytes)
  std::string note;  // empty when the figure is the run's own peak
};

class PeakMemoryProbe {
 public:
  // `cuda`: measure the CUDA device's allocator instead of the host.
  explicit PeakMemoryProbe(bool cuda = false) : cuda_(cuda) {}

  // Starts a new measurement: the peak restarts at what is in use now.
  void reset();
  // The peak since reset().
  PeakMemory peak() const;
  // True when reset() restarted the measured peak (the host's clear_refs worked); false
  // before any reset() and where only the process-wide peak is available.
  bool restarted() const { return restarted_; }
  bool cuda() const { return cuda_; }

 private:
  bool cuda_ = false;
  bool restarted_ = false;
  std::string reset_failure_;     // why the host's high-water mark was not restarted
};

}  // namespace mixprec
