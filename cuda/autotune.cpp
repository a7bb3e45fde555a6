// The autotuners' switch and timing loop (contract in autotune.h).
#include "cuda/autotune.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "core/error.h"
#include "cuda/caching_allocator.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_event.h"

namespace mixprec {
namespace {

// One candidate's calls: the untimed first call, then kAutotuneTimedCalls calls, each ending
// at an event (the first event marks the end of the untimed call).
struct CandidateRun {
  bool all_launched = false;
  CudaEvent marks[kAutotuneTimedCalls + 1];
};

}  // namespace

size_t Autotuner::pick_fastest(const TuningCandidates& candidates, CUstream_st* stream,
                               CachingAllocator& allocator) {
  const size_t count = candidates.workspace_bytes.size();
  if (count < 2) return 0;
  if (cudaPeekAtLastError() != cudaSuccess) return 0;

  // A problem whose scratch memory does not fit next to the caller's data is left to the
  // library's first choice rather than failing the call: tuning is an optimisation.
  std::optional<Scratch> output, workspace;
  try {
    output.emplace(allocator, candidates.output_bytes);
    workspace.emplace(allocator, *std::max_element(candidates.workspace_bytes.begin(),
                                                   candidates.workspace_bytes.end()));
  } catch (const Error&) {
    return 0;
  }

  std::vector<CandidateRun> runs(count);
  const CudaEvent* last = nullptr;
  for (size_t i = 0; i < count; ++i) {
    void* ws = candidates.workspace_bytes[i] > 0 ? workspace->get() : nullptr;
    CandidateRun& run = runs[i];
    run.all_launched = true;
    for (int call = 0; call <= kAutotuneTimedCalls; ++call) {
      if (!candidates.launch(i, output->get(), ws)) {
        // The library may leave its launch's error as the runtime's last error; clear it, so
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

  size_t best = 0;
  float best_ms = 0.0f;
  bool found = false;
  uint64_t timed = 0;
  for (size_t i = 0; i < count; ++i) {
    if (!runs[i].all_launched) continue;
    float ms[kAutotuneTimedCalls];
    for (int call = 0; call < kAutotuneTimedCalls; ++call) {
      CUDA_CHECK(cudaEventElapsedTime(&ms[call], runs[i].marks[call].get(),
                                      runs[i].marks[call + 1].get()));
    }
    std::sort(ms, ms + kAutotuneTimedCalls);
    const float median = ms[kAutotuneTimedCalls / 2];
    ++timed;
    if (!found || median < best_ms) {
      best = i;
      best_ms = median;
      found = true;
    }
  }
  timed_.fetch_add(timed, std::memory_order_relaxed);
  return found ? best : 0;
}

}  // namespace mixprec
