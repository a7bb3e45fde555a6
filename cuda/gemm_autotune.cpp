// The GEMM autotuner's switch and its timing loop (contract in gemm_autotune.h).
#include "cuda/gemm_autotune.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "cuda/caching_allocator.h"
#include "cuda/cuda_check.h"

namespace mixprec {
namespace {

constexpr const char* kVariable = "MIXPREC_GEMM_AUTOTUNE";

// The switch: not yet decided (the environment is read on the first query), off or on.
enum SwitchState : int { kUnread, kOff, kOn };
std::atomic<int> g_switch{kUnread};
std::atomic<uint64_t> g_candidates_timed{0};

// A CUDA event that records timestamps, destroyed with its owner.
class TimingEvent {
 public:
  TimingEvent() { CUDA_CHECK(cudaEventCreate(&event_)); }
  ~TimingEvent() { cudaEventDestroy(event_); }
  TimingEvent(const TimingEvent&) = delete;
  TimingEvent& operator=(const TimingEvent&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// One candidate's calls: the untimed first call, then kGemmAutotuneTimedCalls calls, each
// ending at an event (the first event marks the end of the untimed call).
struct CandidateRun {
  bool all_launched = false;
  TimingEvent marks[kGemmAutotuneTimedCalls + 1];
};

}  // namespace

bool gemm_autotune_from_environment() {
  const char* text = std::getenv(kVariable);
  if (text == nullptr) return false;
  const std::string_view value(text);
  if (value == "1") return true;
  if (value == "0") return false;
  MIXPREC_FAIL("environment variable ", kVariable, "=\"", value,
               "\" is not a valid value: use 1 (autotune cuBLASLt GEMM algorithms) or 0 / unset "
               "(the heuristic's first algorithm)");
}

bool gemm_autotune_enabled() {
  int state = g_switch.load(std::memory_order_acquire);
  if (state == kUnread) {
    // Throws, leaving the switch unread, for a bad value: every query reports it until the
    // variable is fixed or the switch is set.
    const int from_environment = gemm_autotune_from_environment() ? kOn : kOff;
    // A concurrent set_gemm_autotune wins over the environment.
    state = kUnread;
    if (!g_switch.compare_exchange_strong(state, from_environment, std::memory_order_acq_rel))
      return state == kOn;
    state = from_environment;
  }
  return state == kOn;
}

void set_gemm_autotune(bool on) { g_switch.store(on ? kOn : kOff, std::memory_order_release); }

uint64_t gemm_autotune_candidates_timed() {
  return g_candidates_timed.load(std::memory_order_relaxed);
}

size_t pick_fastest_gemm_candidate(const GemmTuning& tuning, CUstream_st* stream,
                                   CachingAllocator& allocator) {
  const size_t count = tuning.workspace_bytes.size();
  if (count < 2) return 0;
  // An error already pending belongs to an earlier call: tuning would clear it with its own
  // failed candidates, so the heuristic's choice stands and the error is left to its check.
  if (cudaPeekAtLastError() != cudaSuccess) return 0;

  // A problem whose scratch output does not fit next to the caller's data is left to the
  // heuristic rather than failing the GEMM: tuning is an optimisation.
  std::optional<Scratch> output, workspace;
  try {
    output.emplace(allocator, tuning.output_bytes);
    workspace.emplace(allocator, *std::max_element(tuning.workspace_bytes.begin(),
                                                   tuning.workspace_bytes.end()));
  } catch (const Error&) {
    return 0;
  }

  // Every candidate's calls are queued back to back and the host waits once, at the end: a
  // wait per candidate would leave the device idle between them for no better figure.
  std::vector<CandidateRun> runs(count);
  const TimingEvent* last = nullptr;
  for (size_t i = 0; i < count; ++i) {
    void* ws = tuning.workspace_bytes[i] > 0 ? workspace->get() : nullptr;
    CandidateRun& run = runs[i];
    run.all_launched = true;
    for (int call = 0; call <= kGemmAutotuneTimedCalls; ++call) {
      if (!tuning.launch(i, output->get(), ws)) {
        // cuBLASLt may leave its launch's error as the runtime's last error; clear it, so
        // that the next kernel's launch check does not report it as its own.
        (void)cudaGetLastError();
        run.all_launched = false;
        break;
      }
      CUDA_CHECK(cudaEventRecord(run.marks[call].get(), stream));
      last = &run.marks[call];
    }
  }
  if (last == nullptr) return 0;
  CUDA_CHECK(cudaEventSynchronize(last->get()));

  // The median of the timed calls decides (why the median: gemm_autotune.h).
  size_t best = 0;
  float best_ms = 0.0f;
  bool found = false;
  uint64_t timed = 0;
  for (size_t i = 0; i < count; ++i) {
    if (!runs[i].all_launched) continue;
    float ms[kGemmAutotuneTimedCalls];
    for (int call = 0; call < kGemmAutotuneTimedCalls; ++call) {
      CUDA_CHECK(cudaEventElapsedTime(&ms[call], runs[i].marks[call].get(),
                                      runs[i].marks[call + 1].get()));
    }
    std::sort(ms, ms + kGemmAutotuneTimedCalls);
    const float median = ms[kGemmAutotuneTimedCalls / 2];
    ++timed;
    // Strictly faster only: a tie keeps the heuristic's earlier (preferred) candidate.
    if (!found || median < best_ms) {
      best = i;
      best_ms = median;
      found = true;
    }
  }
  g_candidates_timed.fetch_add(timed, std::memory_order_relaxed);
  return found ? best : 0;
}

}  // namespace mixprec
