#include "apps/tensorboard/event_file.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "apps/tensorboard/event.pb.h"
#include "core/error.h"

namespace mixprec::tensorboard {

namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefix = "events.out.tfevents.";

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  std::string host(name);
  // Part of a file name: a '/' (not allowed in host names, but not ruled out either) would
  // name a folder.
  std::replace(host.begin(), host.end(), '/', '_');
  return host;
}

// The seconds field of an event file's name, or -1 for another file.
int64_t seconds_of(const std::string& name) {
  const std::string prefix = kPrefix;
  if (name.rfind(prefix, 0) != 0) return -1;
  int64_t seconds = 0;
  size_t i = prefix.size();
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i)
    seconds = seconds * 10 + (name[i] - '0');
  return i == prefix.size() ? -1 : seconds;
}

void append_event(TFRecordWriter& file, const Event& event) {
  std::string bytes;
  MIXPREC_CHECK(event.SerializeToString(&bytes), "cannot encode an event for ", file.path());
  file.append(bytes);
}

Event event_at(int64_t step) {
  Event event;
  event.set_wall_time(unix_now());
  event.set_step(step);
  return event;
}

}  // namespace

std::string event_file_name(const std::string& dir, int64_t unix_seconds) {
  int64_t seconds = unix_seconds;
  std::error_code error;
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error))
    seconds = std::max(seconds, seconds_of(it->path().filename().string()) + 1);
  char stamp[32];
  std::snprintf(stamp, sizeof stamp, "%010lld", static_cast<long long>(seconds));
  return std::string(kPrefix) + stamp + "." + host_name() + "." + std::to_string(getpid());
}

EventFileWriter::EventFileWriter(const std::string& dir)
    : file_([&dir] {
        std::error_code error;
        fs::create_directories(dir, error);
        MIXPREC_CHECK(!error && fs::is_directory(dir, error), "cannot create the folder '", dir,
                      "' for the TensorBoard event file: ",
                      error ? error.message() : "a file of that name exists");
        const auto now = static_cast<int64_t>(unix_now());
        return (fs::path(dir) / event_file_name(dir, now)).string();
      }()) {
  Event event = event_at(0);
  event.set_file_version("brain.Event:2");
  append_event(file_, event);
}

void EventFileWriter::write_scalars(int64_t step, const std::vector<Scalar>& scalars) {
  if (scalars.empty()) return;
  Event event = event_at(step);
  Summary* summary = event.mutable_summary();
  for (const Scalar& scalar : scalars) {
    Summary::Value* value = summary->add_value();
    value->set_tag(scalar.tag);
    value->set_simple_value(static_cast<float>(scalar.value));
  }
  append_event(file_, event);
}

void EventFileWriter::write_histograms(
    int64_t step, const std::vector<std::pair<std::string, Histogram>>& histograms) {
  if (histograms.empty()) return;
  Event event = event_at(step);
  Summary* summary = event.mutable_summary();
  for (const auto& [tag, histogram] : histograms) {
    MIXPREC_CHECK(histogram.limits.size() == histogram.counts.size(), "histogram '", tag,
                  "': ", histogram.limits.size(), " bucket limits for ",
                  histogram.counts.size(), " counts");
    Summary::Value* value = summary->add_value();
    value->set_tag(tag);
    HistogramProto* histo = value->mutable_histo();
    histo->set_min(histogram.min);
    histo->set_max(histogram.max);
    histo->set_num(histogram.num);
    histo->set_sum(histogram.sum);
    histo->set_sum_squares(histogram.sum_squares);
    for (const double limit : histogram.limits) histo->add_bucket_limit(limit);
    for (const double count : histogram.counts) histo->add_bucket(count);
  }
  append_event(file_, event);
}

void EventFileWriter::write_session_start(int64_t step) {
  Event event = event_at(step);
  event.mutable_session_log()->set_status(SessionLog::START);
  append_event(file_, event);
}

}  // namespace mixprec::tensorboard
