#include "cuda/kernel_profile.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/report_file.h"

namespace mixprec {
namespace {

// A failed runtime call also becomes cudaGetLastError()'s answer; the profiler must not
// leave one behind for the CUDA_CHECK_LAST after the launch it brackets to misread. (A sticky
// error cannot be cleared, and the launch check reports it anyway.)
bool ok(cudaError_t status) {
  if (status == cudaSuccess) return true;
  cudaGetLastError();
  return false;
}

// One bracketed launch; `id` ties it to its ProfiledLaunch however the pending list moves.
struct PendingPair {
  uint64_t id;
  const char* kernel;
  const char* site;
  int64_t blocks;
  int64_t threads_per_block;
  cudaEvent_t start;
  cudaEvent_t stop;
  bool stopped;
  double host_ms;  // the host's time inside the call, known once stopped
};

struct Totals {
  int64_t calls = 0;
  double ms = 0.0;
  double host_ms = 0.0;
  int64_t max_blocks = 0;
  int64_t threads_per_block = 0;

  void add_shape(int64_t blocks, int64_t threads) {
    if (blocks > max_blocks) {
      max_blocks = blocks;
      threads_per_block = threads;
    }
  }
};

int64_t count_of(dim3 shape) {
  return static_cast<int64_t>(shape.x) * shape.y * shape.z;
}

int64_t host_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The launching function as an error message names it (function_name, cuda_check.h), with
// its template arguments where the compiler gives them, without the project's namespaces.
std::string short_site(const char* pretty) {
  std::string site = detail::function_name(pretty);
  const std::string text(pretty);
  const size_t with = text.find("[with ");
  if (with == std::string::npos) return site;
  std::string arguments = text.substr(with);
  for (const char* own : {"mixprec::", "kernels::", "{anonymous}::", "(anonymous namespace)::"}) {
    for (size_t at = arguments.find(own); at != std::string::npos; at = arguments.find(own, at)) {
      arguments.erase(at, std::char_traits<char>::length(own));
    }
  }
  return site.append(" ").append(arguments);
}

class Profile {
 public:
  static Profile& instance() {
    // Never destroyed: the exit handler and late launches may still use it.
    static Profile* profile = new Profile();
    return *profile;
  }

  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  void set_enabled(bool on) { enabled_.store(on, std::memory_order_relaxed); }

  // The id of the pair now recording, or 0 when this launch is not timed.
  uint64_t begin(const char* kernel, const char* site, cudaStream_t stream, dim3 grid,
                 dim3 block) {
    // An error already pending belongs to an earlier call; recording an event could end up
    // clearing it (see ok()), so that launch goes untimed and the error to its check.
    if (cudaPeekAtLastError() != cudaSuccess) return 0;
    std::lock_guard<std::mutex> lock(mutex_);
    if (report_path_ != nullptr && !exit_handler_registered_) {
      // Registered after the CUDA runtime's own teardown (this is a launch, so the runtime is
      // up), hence run before it.
      std::atexit([] { Profile::instance().write_report(); });
      exit_handler_registered_ = true;
    }
    if (pending_.size() >= static_cast<size_t>(kProfileBatch)) drain_locked();
    cudaEvent_t start = take_event_locked(), stop = take_event_locked();
    if (start == nullptr || stop == nullptr || !ok(cudaEventRecord(start, stream))) {
      give_back_locked(start);
      give_back_locked(stop);
      return 0;
    }
    const uint64_t id = ++last_id_;
    pending_.push_back(
        {id, kernel, site, count_of(grid), count_of(block), start, stop, false, 0.0});
    return id;
  }

  void end(uint64_t id, cudaStream_t stream, double host_ms) {
    if (cudaPeekAtLastError() != cudaSuccess) return;  // the launch's own error: left to it
    std::lock_guard<std::mutex> lock(mutex_);
    // One drained meanwhile is not found and stays untimed.
    const auto it = find_pending_locked(id);
    if (it == pending_.rend()) return;
    it->host_ms = host_ms;
    it->stopped = ok(cudaEventRecord(it->stop, stream));
  }

  // Drops the pair `id` (its events go back to the pool; a recorded event is reusable).
  void cancel(uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = find_pending_locked(id);
    if (it == pending_.rend()) return;
    give_back_locked(it->start);
    give_back_locked(it->stop);
    pending_.erase(std::next(it).base());
  }

  void reset() {
    std::lock_guard<std::mutex> lock(mutex_);
    drain_locked();
    totals_.clear();
  }

  std::vector<KernelProfileRow> rows() {
    std::lock_guard<std::mutex> lock(mutex_);
    drain_locked();
    // The same literal may sit at different addresses in different translation units.
    std::map<std::pair<std::string, std::string>, Totals> merged;
    for (const auto& [key, totals] : totals_) {
      Totals& into = merged[{key.first, short_site(key.second)}];
      into.calls += totals.calls;
      into.ms += totals.ms;
      into.host_ms += totals.host_ms;
      into.add_shape(totals.max_blocks, totals.threads_per_block);
    }
    std::vector<KernelProfileRow> out;
    for (const auto& [key, totals] : merged) {
      out.push_back({key.first, key.second, totals.calls, totals.ms, totals.host_ms,
                     totals.max_blocks, totals.threads_per_block});
    }
    std::stable_sort(out.begin(), out.end(),
                     [](const KernelProfileRow& a, const KernelProfileRow& b) {
                       return a.total_ms > b.total_ms;
                     });
    return out;
  }

 private:
  Profile() {
    const char* path = std::getenv("MIXPREC_KERNEL_PROFILE");
    if (path != nullptr && *path != '\0') {
      report_path_ = path;
      enabled_.store(true, std::memory_order_relaxed);
    }
  }

  // The pending pair `id`, searched from the newest (almost always the one sought); rend()
  // when it was drained meanwhile.
  std::vector<PendingPair>::reverse_iterator find_pending_locked(uint64_t id) {
    return std::find_if(pending_.rbegin(), pending_.rend(),
                        [id](const PendingPair& pair) { return pair.id == id; });
  }

  cudaEvent_t take_event_locked() {
    if (!free_events_.empty()) {
      cudaEvent_t event = free_events_.back();
      free_events_.pop_back();
      return event;
    }
    cudaEvent_t event = nullptr;
    return ok(cudaEventCreate(&event)) ? event : nullptr;
  }

  void give_back_locked(cudaEvent_t event) {
    if (event != nullptr) free_events_.push_back(event);
  }

  // Adds the time of every stopped pair to the totals, waiting for each (cheap once the
  // newest has completed, and right for pairs of other streams too). Pairs whose launch has
  // not stopped yet (another thread's, in flight) stay pending.
  void drain_locked() {
    std::vector<PendingPair> in_flight;
    for (PendingPair& pair : pending_) {
      if (!pair.stopped) {
        in_flight.push_back(pair);
        continue;
      }
      float ms = 0.0f;
      if (ok(cudaEventSynchronize(pair.stop)) &&
          ok(cudaEventElapsedTime(&ms, pair.start, pair.stop))) {
        Totals& totals = totals_[{pair.kernel, pair.site}];
        ++totals.calls;
        totals.ms += ms;
        totals.host_ms += pair.host_ms;
        totals.add_shape(pair.blocks, pair.threads_per_block);
      }
      give_back_locked(pair.start);
      give_back_locked(pair.stop);
    }
    pending_ = std::move(in_flight);
  }

  void write_report() {
    write_report_file("MIXPREC_KERNEL_PROFILE", report_path_, kernel_profile_table());
  }

  std::atomic<bool> enabled_{false};
  std::mutex mutex_;
  std::vector<PendingPair> pending_;
  std::vector<cudaEvent_t> free_events_;
  std::map<std::pair<const char*, const char*>, Totals> totals_;
  const char* report_path_ = nullptr;
  bool exit_handler_registered_ = false;
  uint64_t last_id_ = 0;
};

}  // namespace

bool kernel_profile_enabled() { return Profile::instance().enabled(); }

void set_kernel_profile(bool on) { Profile::instance().set_enabled(on); }

void reset_kernel_profile() { Profile::instance().reset(); }

std::vector<KernelProfileRow> kernel_profile() { return Profile::instance().rows(); }

std::string kernel_profile_table() {
  const std::vector<KernelProfileRow> rows = kernel_profile();
  if (rows.empty()) return "no kernel launches were timed\n";
  double total_ms = 0.0, host_ms = 0.0;
  int64_t calls = 0;
  for (const KernelProfileRow& row : rows) {
    total_ms += row.total_ms;
    host_ms += row.host_ms;
    calls += row.calls;
  }
  std::ostringstream out;
  char line[192];
  std::snprintf(line, sizeof line, "%7s %12s %9s %10s %10s %14s  %s\n", "share", "total ms",
                "calls", "mean us", "host us", "largest grid", "kernel  (launched by)");
  out << line;
  for (const KernelProfileRow& row : rows) {
    char grid[48] = "-";
    if (row.max_blocks > 0) {
      std::snprintf(grid, sizeof grid, "%lldx%lld", static_cast<long long>(row.max_blocks),
                    static_cast<long long>(row.threads_per_block));
    }
    std::snprintf(line, sizeof line, "%6.2f%% %12.3f %9lld %10.2f %10.2f %14s  ",
                  total_ms > 0.0 ? 100.0 * row.total_ms / total_ms : 0.0, row.total_ms,
                  static_cast<long long>(row.calls), 1e3 * row.total_ms / row.calls,
                  1e3 * row.host_ms / row.calls, grid);
    out << line << row.kernel << "  (" << row.site << ")\n";
  }
  std::snprintf(line, sizeof line, "%6.2f%% %12.3f %9lld %10s %10s %14s  ", 100.0, total_ms,
                static_cast<long long>(calls), "", "", "");
  out << line << "all timed launches\n";
  // Read by scripts/gpu_check.sh beside the device total above.
  std::snprintf(line, sizeof line, "host time inside the timed calls: %.3f ms\n", host_ms);
  out << line;
  return out.str();
}

ProfiledLaunch::ProfiledLaunch(const char* kernel, const char* site, cudaStream_t stream,
                               dim3 grid, dim3 block)
    : stream_(stream) {
  Profile& profile = Profile::instance();
  if (profile.enabled()) id_ = profile.begin(kernel, site, stream, grid, block);
  if (id_ != 0) host_start_ns_ = host_now_ns();
}

void ProfiledLaunch::cancel() {
  if (id_ != 0) Profile::instance().cancel(id_);
  id_ = 0;
}

ProfiledLaunch::~ProfiledLaunch() {
  if (id_ == 0) return;
  const double host_ms = static_cast<double>(host_now_ns() - host_start_ns_) * 1e-6;
  Profile::instance().end(id_, stream_, host_ms);
}

}  // namespace mixprec
