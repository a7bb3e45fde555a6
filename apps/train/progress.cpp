#include "apps/train/progress.h"

#include <cmath>
#include <cstdio>

namespace mixprec {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto total = static_cast<int64_t>(seconds + 0.5);
  char text[32];
  if (total >= 3600) {
    std::snprintf(text, sizeof text, "%lldh%02lldm", static_cast<long long>(total / 3600),
                  static_cast<long long>(total % 3600 / 60));
  } else if (total >= 60) {
    std::snprintf(text, sizeof text, "%lldm%02llds", static_cast<long long>(total / 60),
                  static_cast<long long>(total % 60));
  } else {
    std::snprintf(text, sizeof text, "%llds", static_cast<long long>(total));
  }
  return text;
}

void Progress::step(const ProgressLine& line) {
  char text[256];
  const double fraction = line.total > 0 ? static_cast<double>(line.step) / line.total : 0.0;
  if (bar_) {
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(fraction * kWidth);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(kWidth, '.');
    // A loss read at an earlier step says which step it is from.
    char loss[48];
    if (line.loss_step == line.step) {
      std::snprintf(loss, sizeof loss, "%.4f", line.loss);
    } else if (line.loss_step > 0) {
      std::snprintf(loss, sizeof loss, "%.4f@%lld", line.loss, static_cast<long long>(line.loss_step));
    } else {
      std::snprintf(loss, sizeof loss, "-");
    }
    std::snprintf(text, sizeof text,
                  "\r[%s] %lld/%lld loss %s scale %g %.0f %s eta %s%s\033[K", bar.c_str(),
                  static_cast<long long>(line.step), static_cast<long long>(line.total), loss,
                  line.scale, line.throughput, line.unit, format_duration(line.eta_s).c_str(),
                  line.skipped ? " (skipped)" : "");
    out_ << text << std::flush;
    bar_drawn_ = true;
    return;
  }
  std::snprintf(text, sizeof text,
                "step %lld/%lld  loss %.4f  scale %g  lr %.3g  %.0f %s  eta %s%s",
                static_cast<long long>(line.step), static_cast<long long>(line.total), line.loss,
                line.scale, line.lr, line.throughput, line.unit,
                format_duration(line.eta_s).c_str(), line.skipped ? "  (skipped)" : "");
  out_ << text << "\n" << std::flush;
}

void Progress::message(const std::string& text) {
  if (bar_drawn_) {
    out_ << "\r\033[K";
    bar_drawn_ = false;
  }
  out_ << text << "\n" << std::flush;
}

void Progress::finish() {
  if (bar_drawn_) out_ << "\n" << std::flush;
  bar_drawn_ = false;
}

}  // namespace mixprec
