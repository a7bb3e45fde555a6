// Progress of a training run: on a terminal, one bar redrawn in place (steps, loss, scale,
// throughput, ETA); elsewhere (a log file, a pipe, CI), one plain line per logged step.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

namespace mixprec {

struct ProgressLine {
  int64_t step = 0;
  int64_t total = 0;
  double loss = 0.0;
  int64_t loss_step = 0;  // the step `loss` belongs to (on a GPU, the last log step)
  double scale = 1.0;
  double lr = 0.0;
  double throughput = 0.0;  // samples/s or tokens/s
  const char* unit = "samples/s";
  double eta_s = 0.0;
  bool skipped = false;
};

class Progress {
 public:
  // `bar`: redraw a bar on `out` (a terminal) instead of writing lines.
  Progress(std::ostream& out, bool bar) : out_(out), bar_(bar) {}
  // Called every step when drawing a bar; only at log steps otherwise.
  void step(const ProgressLine& line);
  // A message that must stay visible (evaluation, checkpoint, skipped step): clears the bar
  // first.
  void message(const std::string& text);
  // Ends the bar's line.
  void finish();
  bool bar() const { return bar_; }

 private:
  std::ostream& out_;
  bool bar_;
  bool bar_drawn_ = false;
};

std::string format_duration(double seconds);  // "1h02m", "3m05s", "12s"

}  // namespace mixprec
