// Device time per kernel: where a training step's GPU time goes, on machines that have no
// profiler (the lent GPU machine has no nsys).
//
// Off by default, and then a launch pays one relaxed load of a flag. On, each kernel launch
// (MIXPREC_LAUNCH, cuda/kernels/common.cuh), cuBLASLt matmul and cuDNN convolution is
// bracketed by two CUDA events on its stream, and the pairs are read back in batches:
// every kProfileBatch launches, when the table is asked for, and at exit. Reading them
// waits for the device, so a profiled run is slower and its step times mean nothing; the
// device times between the events are what it is for. Beside them, the host's time inside
// each bracketed call (between the two event records, so the profiler's own work is left
// out): what a launch, a cuBLASLt matmul or a cuDNN call costs the host, which decides
// whether a step of many small launches can keep the device busy.
//
// A launch site is named by the kernel expression (e.g. "softmax_kernel<R>") and the host
// function that launches it, with its template arguments where the compiler names them
// (the elementwise functor and dtype of a launch_map, the row width of a softmax), so one
// kernel template used by many ops is counted per op. Launchers that dispatch on the dtype
// at run time count every dtype in one row. Library calls are named by their plans: a
// cuBLASLt matmul by its problem, a cuDNN convolution by its problem and chosen algorithm.
//
// Switched on by set_kernel_profile(true), or for a whole process by the environment:
// MIXPREC_KERNEL_PROFILE=FILE writes kernel_profile_table() to FILE when the process exits
// ("-" for standard error), if it launched anything on a GPU (a CPU-only run writes
// nothing). The functions are safe to call from any thread; a launch bracketed on one thread
// while another reads the profile is counted at the next read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

namespace mixprec {

// Launches between two read-backs of the event pairs.
inline constexpr int kProfileBatch = 4096;

struct KernelProfileRow {
  std::string kernel;  // the launched kernel or library call
  std::string site;    // the host function that launched it
  int64_t calls = 0;
  double total_ms = 0.0;  // summed device time between each call's two events
  double host_ms = 0.0;   // summed host time inside the calls
  // The largest grid among the calls, in blocks, and its threads per block: a kernel that
  // gives the device's SMs too few blocks shows here. 0 for library calls (cuBLASLt, cuDNN).
  int64_t max_blocks = 0;
  int64_t threads_per_block = 0;
};

// Whether launches are being timed. The first call reads MIXPREC_KERNEL_PROFILE.
bool kernel_profile_enabled();
// Switches timing on or off for the launches that follow (launches already bracketed are
// still read back).
void set_kernel_profile(bool on);
// Forgets every measurement so far (pending pairs are read back and dropped).
void reset_kernel_profile();
// The measurements so far, largest total first (reads back pending pairs).
std::vector<KernelProfileRow> kernel_profile();
// kernel_profile() as a text table: share of the summed time, total ms, calls, mean us,
// mean host us, largest grid (blocks x threads, "-" for a library call), kernel and launch
// site; "no kernel launches were timed" when there are none.
std::string kernel_profile_table();

// Brackets one launch on `stream` from construction to destruction when profiling is on;
// does nothing otherwise, and leaves a launch untimed when a CUDA error is already pending
// (that error stays for the launch's check). `kernel` and `site` must outlive the process's
// profile, its report at exit included: string literals, __PRETTY_FUNCTION__, or strings
// never freed. `grid` and `block` are the kernel's launch shape; a library call leaves them
// empty.
class ProfiledLaunch {
 public:
  ProfiledLaunch(const char* kernel, const char* site, cudaStream_t stream,
                 dim3 grid = dim3(0, 0, 0), dim3 block = dim3(0, 0, 0));
  ~ProfiledLaunch();
  ProfiledLaunch(const ProfiledLaunch&) = delete;
  ProfiledLaunch& operator=(const ProfiledLaunch&) = delete;
  // Leaves this call out of the profile: a library call that refused its operands ran
  // nothing, and counting it would skew its row's means.
  void cancel();

 private:
  uint64_t id_ = 0;  // the pending pair this launch records into; 0 when not timed
  cudaStream_t stream_;
  int64_t host_start_ns_ = 0;  // when the call began, after its start event was recorded
};

}  // namespace mixprec
