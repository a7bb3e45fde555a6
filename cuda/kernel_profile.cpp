#include "cuda/kernel_profile.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

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

struct PendingPair {
  const char* kernel;
  const char* site;
  cudaEvent_t start;
  cudaEvent_t stop;
  bool stopped;
};

struct Totals {
  int64_t calls = 0;
  double ms = 0.0;
};

// The host function's name and template arguments from __PRETTY_FUNCTION__, without the
// return type, the parameter list and the project's namespaces.
std::string short_site(const std::string& pretty) {
  const size_t paren = pretty.find('(');
  const size_t name_start = pretty.rfind(' ', paren);
  std::string site = pretty.substr(name_start == std::string::npos ? 0 : name_start + 1,
                                   paren == std::string::npos ? std::string::npos
                                                              : paren - (name_start + 1));
  const size_t with = pretty.find("[with ");
  if (with != std::string::npos) site.append(" ").append(pretty, with, std::string::npos);
  for (const char* noise : {"mixprec::", "kernels::", "{anonymous}::", "(anonymous namespace)::"}) {
    for (size_t at = site.find(noise); at != std::string::npos; at = site.find(noise, at)) {
      site.erase(at, std::char_traits<char>::length(noise));
    }
  }
  return site;
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

  int begin(const char* kernel, const char* site, cudaStream_t stream) {
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
      return -1;
    }
    pending_.push_back({kernel, site, start, stop, false});
    return static_cast<int>(pending_.size()) - 1;
  }

  void end(int slot, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (slot < 0 || static_cast<size_t>(slot) >= pending_.size()) return;
    PendingPair& pair = pending_[static_cast<size_t>(slot)];
    pair.stopped = ok(cudaEventRecord(pair.stop, stream));
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
    }
    std::vector<KernelProfileRow> out;
    for (const auto& [key, totals] : merged) {
      out.push_back({key.first, key.second, totals.calls, totals.ms});
    }
    std::stable_sort(out.begin(), out.end(), [](const KernelProfileRow& a, const KernelProfileRow& b) {
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

  // Waits for the newest pair and adds every pending pair's time to the totals.
  void drain_locked() {
    if (pending_.empty()) return;
    for (auto it = pending_.rbegin(); it != pending_.rend(); ++it) {
      if (it->stopped) {
        ok(cudaEventSynchronize(it->stop));
        break;
      }
    }
    for (PendingPair& pair : pending_) {
      float ms = 0.0f;
      if (pair.stopped && ok(cudaEventElapsedTime(&ms, pair.start, pair.stop))) {
        Totals& totals = totals_[{pair.kernel, pair.site}];
        ++totals.calls;
        totals.ms += ms;
      }
      give_back_locked(pair.start);
      give_back_locked(pair.stop);
    }
    pending_.clear();
  }

  void write_report() {
    const std::string table = kernel_profile_table();
    const std::string path = report_path_;
    if (path == "-") {
      std::fputs(table.c_str(), stderr);
      return;
    }
    if (std::FILE* file = std::fopen(path.c_str(), "w")) {
      std::fputs(table.c_str(), file);
      std::fclose(file);
    } else {
      std::fprintf(stderr, "MIXPREC_KERNEL_PROFILE: cannot write %s\n", path.c_str());
    }
  }

  std::atomic<bool> enabled_{false};
  std::mutex mutex_;
  std::vector<PendingPair> pending_;
  std::vector<cudaEvent_t> free_events_;
  std::map<std::pair<const char*, const char*>, Totals> totals_;
  const char* report_path_ = nullptr;
  bool exit_handler_registered_ = false;
};

}  // namespace

bool kernel_profile_enabled() { return Profile::instance().enabled(); }

void set_kernel_profile(bool on) { Profile::instance().set_enabled(on); }

void reset_kernel_profile() { Profile::instance().reset(); }

std::vector<KernelProfileRow> kernel_profile() { return Profile::instance().rows(); }

std::string kernel_profile_table() {
  const std::vector<KernelProfileRow> rows = kernel_profile();
  if (rows.empty()) return "no kernel launches were timed\n";
  double total_ms = 0.0;
  int64_t calls = 0;
  for (const KernelProfileRow& row : rows) {
    total_ms += row.total_ms;
    calls += row.calls;
  }
  std::ostringstream out;
  char line[160];
  std::snprintf(line, sizeof line, "%7s %12s %9s %10s  %s\n", "share", "total ms", "calls",
                "mean us", "kernel  (launched by)");
  out << line;
  for (const KernelProfileRow& row : rows) {
    std::snprintf(line, sizeof line, "%6.2f%% %12.3f %9lld %10.2f  ",
                  total_ms > 0.0 ? 100.0 * row.total_ms / total_ms : 0.0, row.total_ms,
                  static_cast<long long>(row.calls), 1e3 * row.total_ms / row.calls);
    out << line << row.kernel << "  (" << row.site << ")\n";
  }
  std::snprintf(line, sizeof line, "%6.2f%% %12.3f %9lld %10s  ", 100.0, total_ms,
                static_cast<long long>(calls), "");
  out << line << "all timed launches\n";
  return out.str();
}

ProfiledLaunch::ProfiledLaunch(const char* kernel, const char* site, cudaStream_t stream)
    : stream_(stream) {
  Profile& profile = Profile::instance();
  if (profile.enabled()) slot_ = profile.begin(kernel, site, stream);
}

ProfiledLaunch::~ProfiledLaunch() {
  if (slot_ >= 0) Profile::instance().end(slot_, stream_);
}

}  // namespace mixprec
