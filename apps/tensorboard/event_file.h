// An event file that TensorBoard reads: `events.out.tfevents.<unix seconds>.<hostname>.<pid>`
// in a log folder, TFRecords (apps/tensorboard/tfrecord.h) each holding one serialized
// Event (event.proto). The first record is the Event {file_version: "brain.Event:2"}.
//
// TensorBoard reads a folder's event files in the order of their names, as the history of
// one run. A new file therefore always sorts after the files already in the folder: its
// seconds are those of its creation, or one more than the newest file's when that one is as
// new (two files made within a second, such as a run resumed at once), and the ten-digit
// seconds keep the names in order until the year 2286.
//
// Every write is flushed (each record is whole in the file once the call returns).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "apps/tensorboard/tfrecord.h"

namespace mixprec::tensorboard {

struct Scalar {
  std::string tag;
  double value = 0.0;  // stored as float (TensorBoard's simple_value)
};

// A histogram in TensorBoard's legacy form: counts[i] values in (limits[i-1], limits[i]],
// the first bucket starting at `min`; limits ascending, as many as counts.
struct Histogram {
  double min = 0.0, max = 0.0;
  double num = 0.0;            // the sum of counts
  double sum = 0.0, sum_squares = 0.0;
  std::vector<double> limits;  // bucket upper edges
  std::vector<double> counts;
};

// The name of a new event file in `dir` for a file made at `unix_seconds`: the seconds
// raised as described above so that it sorts after every event file already there.
std::string event_file_name(const std::string& dir, int64_t unix_seconds);

class EventFileWriter {
 public:
  // Creates `dir` if needed and a new event file in it, and writes the file_version record.
  // Throws mixprec::Error naming the path when the folder or the file cannot be written.
  explicit EventFileWriter(const std::string& dir);

  // One Event at `step` whose Summary holds every scalar of `scalars`, in order (none: no
  // record).
  void write_scalars(int64_t step, const std::vector<Scalar>& scalars);
  // One Event at `step` whose Summary holds every (tag, histogram) of `histograms`.
  void write_histograms(int64_t step,
                        const std::vector<std::pair<std::string, Histogram>>& histograms);
  // A SessionLog START at `step`: TensorBoard's reader, on a START after the first one of
  // the run, drops every point already read (from earlier files) at steps >= `step`.
  void write_session_start(int64_t step);

  const std::string& path() const { return file_.path(); }

 private:
  TFRecordWriter file_;
};

}  // namespace mixprec::tensorboard
