// Linux keeps a per-process resident-set high-water mark that writing "5" to clear_refs
// restarts (proc(5)); that is what lets one process measure several runs one after another.
#include "apps/bench/peak_memory.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#if MIXPREC_WITH_CUDA
#include "cuda/register.h"
#endif

namespace mixprec {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// VmHWM in bytes, or 0 when /proc/self/status has no such line.
uint64_t host_high_water_mark() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) != 0) continue;
    std::istringstream fields(line.substr(6));
    uint64_t kib = 0;
    fields >> kib;  // "VmHWM:    1640 kB"
    return kib * 1024;
  }
  return 0;
}

// The process's peak resident set since it started, in bytes (ru_maxrss is in KiB on Linux).
uint64_t process_peak_rss() {
  struct rusage usage {};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<uint64_t>(usage.ru_maxrss) * 1024;
}

}  // namespace

void PeakMemoryProbe::reset() {
#if MIXPREC_WITH_CUDA
  if (cuda_) {
    cuda_reset_allocator_peaks();
    restarted_ = true;
    return;
  }
#endif
  restarted_ = false;
  reset_failure_.clear();
  const int fd = ::open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    reset_failure_ = std::string("cannot open /proc/self/clear_refs: ") + std::strerror(errno);
    return;
  }
  // "5" restarts the peak resident set size and touches nothing else.
  const ssize_t written = ::write(fd, "5", 1);
  const int error = errno;
  ::close(fd);
  if (written != 1) {
    reset_failure_ = std::string("cannot write /proc/self/clear_refs: ") + std::strerror(error);
    return;
  }
  restarted_ = host_high_water_mark() > 0;
  if (!restarted_) reset_failure_ = "/proc/self/status has no VmHWM line";
}

PeakMemory PeakMemoryProbe::peak() const {
  PeakMemory result;
#if MIXPREC_WITH_CUDA
  if (cuda_) {
    result.mib = static_cast<double>(cuda_allocator_stats().peak_bytes_in_use) / kMiB;
    return result;
  }
#endif
  if (restarted_) {
    result.mib = static_cast<double>(host_high_water_mark()) / kMiB;
    return result;
  }
  result.mib = static_cast<double>(process_peak_rss()) / kMiB;
  result.note = "process peak: the resident-set peak of the whole process so far (" +
                (reset_failure_.empty() ? std::string("not reset") : reset_failure_) + ")";
  return result;
}

}  // namespace mixprec
