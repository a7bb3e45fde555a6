// Both charts put the precisions side by side, so every curve keeps one colour (its position
// in the bench) across the two panels of loss.png and in scale.png.
#include "apps/bench/bench_charts.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "apps/checkpoint/atomic_file.h"
#include "apps/plot/gnuplot.h"
#include "core/error.h"

namespace mixprec {

namespace fs = std::filesystem;

namespace {

void write_data(const std::string& path, const std::string& text) {
  write_file_atomic(path, text.data(), text.size());
}

std::string loss_data(const std::vector<LossPoint>& points) {
  std::ostringstream text;
  text.precision(10);
  text << "# step elapsed_s loss\n";
  for (const LossPoint& p : points) text << p.step << ' ' << p.elapsed_s << ' ' << p.loss << '\n';
  return text.str();
}

std::string scale_data(const std::vector<ScalePoint>& points) {
  std::ostringstream text;
  text.precision(10);
  text << "# step scale skipped\n";
  for (const ScalePoint& p : points) {
    text << p.step << ' ' << p.scale << ' ' << (p.skipped ? 1 : 0) << '\n';
  }
  return text.str();
}

// The style of a curve: lines, with points when there are too few for a line to show.
std::string curve_style(size_t points) {
  return points <= 20 ? "with linespoints pt 7 ps 0.8" : "with lines";
}

// Names such as "cnn_fashion" are shown as written, not as subscripts.
const char* kPlainText = "set termoption noenhanced\n";

void report(const ChartResult& chart, std::vector<std::string>& drawn, std::ostream& log) {
  log << "bench: " << chart.message << "\n";
  if (chart.rendered) drawn.push_back(fs::path(chart.png_path).filename().string());
}

}  // namespace

std::vector<LossPoint> read_loss_points(const std::string& metrics_path) {
  std::ifstream in(metrics_path);
  MIXPREC_CHECK(in.good(), "cannot read ", metrics_path);
  std::vector<LossPoint> points;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
    if (record.is_discarded() || record.value("event", "") != "step") continue;
    if (!record.contains("loss") || !record["loss"].is_number()) continue;  // "nan", "inf"
    LossPoint p;
    p.step = record.value("step", int64_t{0});
    p.elapsed_s = record.value("elapsed_s", 0.0);
    p.loss = record["loss"].get<double>();
    if (std::isfinite(p.loss)) points.push_back(p);
  }
  return points;
}

std::vector<std::string> draw_bench_charts(const std::string& out_dir, const std::string& name,
                                           const std::vector<PrecisionCurves>& curves,
                                           std::ostream& log) {
  std::vector<std::string> drawn;
  const std::string title = gnuplot_quote(name);

  std::string by_step, by_time;
  for (size_t i = 0; i < curves.size(); ++i) {
    const PrecisionCurves& c = curves[i];
    const std::string file = "loss_" + c.precision + ".dat";
    write_data((fs::path(out_dir) / file).string(), loss_data(c.loss));
    if (c.loss.empty()) {
      log << "bench: " << c.precision << " has no finite loss to draw\n";
      continue;
    }
    const std::string curve = curve_style(c.loss.size()) + " lw 2 lc " +
                              std::to_string(i + 1) + " title '" +
                              gnuplot_quote(c.precision) + "'";
    by_step += std::string(by_step.empty() ? "plot " : ", \\\n     ") + "'" +
               gnuplot_quote(file) + "' using 1:3 " + curve;
    by_time += std::string(by_time.empty() ? "plot " : ", \\\n     ") + "'" +
               gnuplot_quote(file) + "' using 2:3 " + curve;
  }
  if (by_step.empty()) {
    log << "bench: loss.png not drawn: no precision has a finite loss\n";
  } else {
    const std::string script = std::string(kPlainText) +
                               "set multiplot layout 1,2 title '" + title +
                               ": training loss'\n"
                               "set grid\nset key top right\nset ylabel 'loss'\n"
                               "set xlabel 'step'\n" + by_step + "\n"
                               "set xlabel 'training time (s)'\n" + by_time + "\n"
                               "unset multiplot\n";
    report(render_chart(out_dir, "loss", script, 1200, 500), drawn, log);
  }

  std::string scale_plot;
  for (size_t i = 0; i < curves.size(); ++i) {
    const PrecisionCurves& c = curves[i];
    if (!c.scales || c.scale.empty()) continue;
    const std::string file = "scale_" + c.precision + ".dat";
    write_data((fs::path(out_dir) / file).string(), scale_data(c.scale));
    const std::string colour = " lc " + std::to_string(i + 1);
    scale_plot += std::string(scale_plot.empty() ? "plot " : ", \\\n     ") + "'" +
                  gnuplot_quote(file) + "' using 1:2 with steps lw 2" + colour + " title '" +
                  gnuplot_quote(c.precision) + "'";
    bool any_skipped = false;
    for (const ScalePoint& p : c.scale) any_skipped = any_skipped || p.skipped;
    // A data file whose points are all undefined makes gnuplot warn, so only runs that
    // skipped a step get the points.
    if (any_skipped) {
      scale_plot += ", \\\n     '" + gnuplot_quote(file) +
                    "' using 1:($3 > 0 ? $2 : 1/0) with points pt 7 ps 1.2" + colour +
                    " title '" + gnuplot_quote(c.precision) + " skipped'";
    }
  }
  if (scale_plot.empty()) {
    log << "bench: scale.png not drawn: no precision here scales its loss\n";
  } else {
    const std::string script = std::string(kPlainText) + "set title '" + title +
                               ": loss scale (points: skipped steps)'\n"
                               "set grid\nset key top right\nset logscale y 2\n"
                               "set offsets 0, 0, graph 0.05, graph 0.05\n"
                               "set format y '2^%L'\nset xlabel 'step'\n"
                               "set ylabel 'loss scale'\n" + scale_plot + "\n";
    report(render_chart(out_dir, "scale", script), drawn, log);
  }
  return drawn;
}

}  // namespace mixprec
