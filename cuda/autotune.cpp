// The autotuners' switch and timing loop (contract in autotune.h).
#include "cuda/autotune.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/caching_allocator.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_event.h"
#include "cuda/report_file.h"

namespace mixprec {
namespace {

// One candidate's calls: the untimed first call, then kAutotuneTimedCalls calls, each ending
// at an event (the first event marks the end of the untimed call).
struct CandidateRun {
  bool all_launched = false;
  CudaEvent marks[kAutotuneTimedCalls + 1];
};

// The process's tuning log (autotune_log() in autotune.h), written at exit where
// MIXPREC_AUTOTUNE_LOG names a file.
class TuningLog {
 public:
  static TuningLog& instance() {
    static TuningLog* log = new TuningLog;  // never destroyed: read by the exit handler
    return *log;
  }

  // One timed problem: medians[i] is NaN for a candidate that failed.
  void add(const TuningCandidates& candidates, const std::vector<float>& medians, size_t chosen) {
    std::string entry = (candidates.problem.empty() ? "a problem" : candidates.problem) + "\n";
    for (size_t i = 0; i < medians.size(); ++i) {
      entry += "  " + (candidates.name ? candidates.name(i) : "candidate " + std::to_string(i));
      if (std::isnan(medians[i])) {
        entry += "  failed\n";
        continue;
      }
      char time[48];
      std::snprintf(time, sizeof time, "  median %.3f us", 1e3 * medians[i]);
      entry += time;
      entry += i == chosen ? "  (chosen)\n" : "\n";
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (!path_.empty() && !exit_handler_registered_) {
      // Registered after the CUDA runtime's own teardown (a tuning has launched), so it runs
      // before it.
      std::atexit([] { TuningLog::instance().write(); });
      exit_handler_registered_ = true;
    }
    text_ += entry;
  }

  std::string text() {
    std::lock_guard<std::mutex> lock(mutex_);
    return text_;
  }

 private:
  TuningLog() {
    const char* path = std::getenv("MIXPREC_AUTOTUNE_LOG");
    if (path != nullptr) path_ = path;
  }
  void write() { write_report_file("MIXPREC_AUTOTUNE_LOG", path_, text()); }

  std::mutex mutex_;
  std::string text_;
  std::string path_;
  bool exit_handler_registered_ = false;
};

}  // namespace

std::string autotune_log() { return TuningLog::instance().text(); }

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
  std::vector<float> medians(count, std::numeric_limits<float>::quiet_NaN());
  for (size_t i = 0; i < count; ++i) {
    if (!runs[i].all_launched) continue;
    float ms[kAutotuneTimedCalls];
    for (int call = 0; call < kAutotuneTimedCalls; ++call) {
      CUDA_CHECK(cudaEventElapsedTime(&ms[call], runs[i].marks[call].get(),
                                      runs[i].marks[call + 1].get()));
    }
    std::sort(ms, ms + kAutotuneTimedCalls);
    const float median = ms[kAutotuneTimedCalls / 2];
    medians[i] = median;
    ++timed;
    if (!found || median < best_ms) {
      best = i;
      best_ms = median;
      found = true;
    }
  }
  timed_.fetch_add(timed, std::memory_order_relaxed);
  if (found) TuningLog::instance().add(candidates, medians, best);
  return found ? best : 0;
}

}  // namespace mixprec
