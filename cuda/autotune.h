// What the CUDA backend's autotuners share (cuda/gemm_autotune.h for cuBLASLt GEMMs,
// cuda/conv_autotune.h for cuDNN convolutions): an on/off switch whose starting value comes
// from an environment variable, and the loop that times a problem's candidate algorithms on
// the stream and keeps the fastest (Autotuner). No CUDA headers, so that the switches can be set from
// anywhere that links the backend.
//
// The timing: every candidate gets one untimed call, then kAutotuneTimedCalls calls, each
// ending at a CUDA event; all candidates' calls are queued back to back and the host waits
// once, at the end (a wait per candidate would leave the device idle between them). The
// candidate of lowest median time wins; a tie keeps the earlier (the heuristic's preferred)
// one. The median, not the minimum: one disturbed call (a clock change, another process's
// kernel) moves neither the figure nor the ranking, and no candidate wins on its one
// luckiest call. Candidates write into a scratch output and a scratch workspace from the
// backend's caching allocator, never into the caller's tensors.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cuda/environment_switch.h"

// The CUDA runtime's stream type (cudaStream_t is CUstream_st*), declared here so that this
// header needs no CUDA header.
struct CUstream_st;

namespace mixprec {

class CachingAllocator;

// Timed calls per candidate, after one untimed call.
inline constexpr int kAutotuneTimedCalls = 3;

// One problem's candidates, in the library's order of preference.
struct TuningCandidates {
  // Workspace bytes of each candidate; its size is the number of candidates.
  std::vector<size_t> workspace_bytes;
  // Bytes of the scratch output, of the layout of the caller's output.
  size_t output_bytes = 0;
  // Queues one call of candidate `index` on the stream, writing its result to `output` and
  // using `workspace` (at least workspace_bytes[index] bytes, null when that is 0); returns
  // false when the launch failed.
  std::function<bool(size_t index, void* output, void* workspace)> launch;
  // For the tuning log (below): the problem, and the name of candidate `index` (when empty,
  // "candidate INDEX").
  std::string problem;
  std::function<std::string(size_t index)> name;
};

// The tuning log: every problem that pick_fastest timed, in order, with each candidate's
// median time (or that it failed) and the one chosen, as text:
//   PROBLEM
//     NAME  median 12.345 us  (chosen)
//     NAME  failed
// For choosing defaults by hand: what the heuristic's first choice costs beside the others.
// MIXPREC_AUTOTUNE_LOG=FILE ("-": standard error) writes it to FILE at exit, if anything
// was timed.
std::string autotune_log();

// One autotuner: a process-wide switch (environment_switch.h) and the count of candidates it
// has timed.
class Autotuner : public EnvironmentSwitch {
 public:
  constexpr Autotuner(const char* variable, const char* on_meaning, const char* off_meaning)
      : EnvironmentSwitch(variable, on_meaning, off_meaning) {}

  // Candidates timed so far by this tuner's pick_fastest (those whose launches all
  // succeeded), for tests and logs.
  uint64_t candidates_timed() const { return timed_.load(std::memory_order_relaxed); }

  // Times the candidates on `stream` (allocating from `allocator`) as described at the top
  // and returns the index of the one with the lowest median time; 0, with nothing timed,
  // when there are fewer than two candidates, when none could be timed, when the scratch
  // memory cannot be allocated, or when a CUDA error is already pending (it belongs to an
  // earlier call, and the candidates' own failures would clear it). A candidate whose launch
  // fails is skipped (its error cleared). Waits for the stream once. Throws mixprec::Error
  // for a CUDA error of the events themselves.
  size_t pick_fastest(const TuningCandidates& candidates, CUstream_st* stream,
                      CachingAllocator& allocator);

 private:
  std::atomic<uint64_t> timed_{0};
};

// Sets a tuner's switch for one scope and puts the previous value back at its end (a
// benchmark or test that compares tuned with untuned calls).
using AutotuneScope = SwitchScope;

}  // namespace mixprec
