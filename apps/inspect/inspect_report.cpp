// inspect.json, summary.txt and the charts of `mixprec inspect`. The FP16 landmarks are
// decoded from bit patterns by core/half.h rather than typed in, so they cannot drift from
// the conversion the fractions come from.
#include "apps/inspect/inspect_report.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "apps/checkpoint/atomic_file.h"
#include "core/half.h"

namespace mixprec::inspect {
namespace {

namespace fs = std::filesystem;

// A gnuplot string literal. Appended piece by piece: GCC 12 misreads `"'" + temporary` as an
// overlapping copy (-Wrestrict).
std::string quoted(const std::string& text) {
  std::string literal = "'";
  literal += gnuplot_quote(text);
  literal += '\'';
  return literal;
}

double fp16_max() { return half_bits_to_float(0x7BFF); }            // 65504
double fp16_min_normal() { return half_bits_to_float(0x0400); }     // 2^-14
double fp16_min_subnormal() { return half_bits_to_float(0x0001); }  // 2^-24

nlohmann::json histogram_json(const char* key, const NamedHistogram& entry) {
  const GradHistogram& h = entry.histogram;
  nlohmann::json bins = nlohmann::json::array();
  for (int k = kLowestBinLog2; k <= kHighestBinLog2; ++k)
    bins.push_back({{"log2", k}, {"count", h.bins[static_cast<size_t>(k - kLowestBinLog2)]}});
  return {{key, entry.name},
          {"elements", h.elements},
          {"zeros", h.zeros},
          {"bins", std::move(bins)},
          {"underflow_bin", h.underflow_bin},
          {"overflow_bin", h.overflow_bin},
          {"underflow_fraction_unscaled", h.underflow_fraction_unscaled()},
          {"underflow_fraction_scaled", h.underflow_fraction_scaled()},
          {"overflow_fraction_scaled", h.overflow_fraction_scaled()},
          {"subnormal_fraction_unscaled", h.subnormal_fraction_unscaled()}};
}

// "65536 (2^16)" for a power of two, else the number.
std::string scale_text(double scale) {
  int exponent = 0;
  const double mantissa = std::frexp(scale, &exponent);
  char text[64];
  if (mantissa == 0.5) {
    std::snprintf(text, sizeof text, "%.17g (2^%d)", scale, exponent - 1);
  } else {
    std::snprintf(text, sizeof text, "%.17g", scale);
  }
  return text;
}

// A fraction as a percentage that shows small values instead of rounding them to 0.00%.
std::string percent(double fraction) {
  char text[32];
  if (fraction == 0.0) return "0%";
  if (fraction < 1e-4) {
    std::snprintf(text, sizeof text, "%.2g%%", fraction * 100.0);
  } else {
    std::snprintf(text, sizeof text, "%.2f%%", fraction * 100.0);
  }
  return text;
}

// The sum of several histograms (their scaled counts share the scale).
GradHistogram total(const std::vector<NamedHistogram>& entries, double scale) {
  GradHistogram sum = make_grad_histogram(scale);
  for (const NamedHistogram& entry : entries) {
    const GradHistogram& h = entry.histogram;
    sum.elements += h.elements;
    sum.zeros += h.zeros;
    sum.flushed_unscaled += h.flushed_unscaled;
    sum.subnormal_unscaled += h.subnormal_unscaled;
    sum.flushed_scaled += h.flushed_scaled;
    sum.overflow_scaled += h.overflow_scaled;
  }
  return sum;
}

void overall_line(std::ostringstream& out, const char* what,
                  const std::vector<NamedHistogram>& entries, double scale) {
  const GradHistogram sum = total(entries, scale);
  out << what << ": " << sum.elements << " values, " << sum.nonzero() << " non-zero. In FP16 "
      << "without scaling " << percent(sum.underflow_fraction_unscaled())
      << " of the non-zero ones flush to zero (" << percent(sum.subnormal_fraction_unscaled())
      << " land on subnormals); times S " << percent(sum.underflow_fraction_scaled())
      << " flush and " << percent(sum.overflow_fraction_scaled()) << " overflow.\n";
}

// One gnuplot chart of the histograms of `entries` (those with values).
ChartResult write_chart(const std::string& dir, const std::string& stem, const std::string& what,
                        const std::vector<NamedHistogram>& entries,
                        const InspectFindings& findings) {
  std::vector<const NamedHistogram*> drawn;
  for (const NamedHistogram& entry : entries)
    if (entry.histogram.elements > 0) drawn.push_back(&entry);
  if (drawn.empty()) {
    ChartResult none;
    none.message = stem + ".png: no " + what + " to draw";
    return none;
  }

  // One block per series, separated by two blank lines: gnuplot's `index`.
  std::ostringstream data;
  data << "# log2|g| (bin [2^k, 2^(k+1))) and the fraction of the series' values in it\n";
  std::string names;
  for (const NamedHistogram* entry : drawn) {
    const GradHistogram& h = entry->histogram;
    data << "# " << entry->name << "\n";
    for (int k = kLowestBinLog2; k <= kHighestBinLog2; ++k) {
      const int64_t count = h.bins[static_cast<size_t>(k - kLowestBinLog2)];
      data << k << ' ' << static_cast<double>(count) / static_cast<double>(h.elements) << '\n';
    }
    data << "\n\n";
    std::string name = entry->name;
    // gnuplot's word() splits the list of titles at blanks.
    std::replace_if(
        name.begin(), name.end(),
        [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }, '_');
    names += (names.empty() ? "" : " ") + name;
  }
  const std::string data_text = data.str();
  write_file_atomic((fs::path(dir) / (stem + ".dat")).string(), data_text.data(), data_text.size());

  const double shift = std::log2(findings.scale);
  std::ostringstream script;
  char title[256];
  std::snprintf(title, sizeof title, "%s of %s (%s, after %lld steps; %lld %s in FP32)",
                what.c_str(), findings.name.c_str(), findings.precision.c_str(),
                static_cast<long long>(findings.steps), static_cast<long long>(findings.batches),
                findings.batches == 1 ? "batch" : "batches");
  script << "set title " << quoted(title) << " noenhanced\n"
         << "set xlabel 'log2 |gradient|'\n"
         << "set ylabel 'fraction of values (exact zeros not drawn)'\n"
         << "set xrange [" << kLowestBinLog2 - 1 << ":" << kHighestBinLog2 + 2 << "]\n"
         << "set yrange [0:*]\n"
         << "set xtics 4\n"
         << "set grid\n"
         << "set key outside right top noenhanced font ',8'\n"
         // FP16's fate of the values as they are: bins up to 2^-25 flush to zero (2^-25
         // itself is a tie that rounds to zero), then subnormals, then normals.
         << "set object 3 rect from graph 0, graph 0 to -25, graph 1 behind fc rgb '#f6d5d5' "
            "fs solid 0.6 noborder\n"
         << "set label 10 '|g| <= 2^-25 flushes to 0 in FP16' at -25, graph 0.5 rotate by 90 "
            "right offset -0.8,0 noenhanced tc rgb '#b03030' font ',8'\n"
         << "set object 1 rect from -24, graph 0 to -14, graph 1 behind fc rgb '#fbe3c8' "
            "fs solid 0.6 noborder\n"
         << "set object 2 rect from -14, graph 0 to 16, graph 1 behind fc rgb '#dcf0dc' "
            "fs solid 0.6 noborder\n";
  struct Mark {
    double x;
    const char* label;
    const char* colour;
  };
  const Mark marks[] = {{-24, "FP16 min subnormal 2^-24", "#d95f02"},
                        {-14, "FP16 min normal 2^-14", "#1b9e77"},
                        {16, "FP16 max 65504", "#7570b3"}};
  int label = 1;
  for (const Mark& m : marks) {
    script << "set arrow from " << m.x << ", graph 0 to " << m.x
           << ", graph 1 nohead lw 2 lc rgb '" << m.colour << "'\n"
           << "set label " << label++ << " " << quoted(m.label) << " at " << m.x
           << ", graph 0.98 rotate by 90 right offset -0.8,0 noenhanced tc rgb '" << m.colour
           << "' font ',8'\n";
  }
  // The same limits seen from the unscaled values when they are multiplied by S: a value
  // at log2 x lands at x + log2 S.
  if (shift != 0.0) {
    for (const Mark& m : marks) {
      const double x = m.x - shift;
      if (x < kLowestBinLog2 - 1 || x > kHighestBinLog2 + 2) continue;
      char text[96];
      std::snprintf(text, sizeof text, "times S = %s: %s", scale_text(findings.scale).c_str(),
                    m.label);
      script << "set arrow from " << x << ", graph 0 to " << x
             << ", graph 1 nohead lw 1 dt 2 lc rgb '" << m.colour << "'\n"
             << "set label " << label++ << " " << quoted(text) << " at " << x
             << ", graph 0.02 rotate by 90 left offset -0.8,0 noenhanced tc rgb '" << m.colour
             << "' font ',7'\n";
    }
  }
  script << "names = " << quoted(names) << "\n"
         << "plot for [i=1:words(names)] '" << stem << ".dat' index (i-1) using 1:2 "
            "with linespoints lw 1.5 pt 7 ps 0.4 title word(names, i)\n";
  const int height = drawn.size() > 24 ? 760 : 600;
  return render_chart(dir, stem, script.str(), 1200, height);
}

}  // namespace

std::vector<std::string> at_risk_names(const InspectFindings& findings) {
  std::vector<std::string> names;
  for (const auto* group : {&findings.gathered.activations, &findings.gathered.weights})
    for (const NamedHistogram& entry : *group)
      if (entry.histogram.underflow_fraction_unscaled() > kAtRiskFraction)
        names.push_back(entry.name);
  return names;
}

nlohmann::json inspect_json(const InspectFindings& f) {
  nlohmann::json activations = nlohmann::json::array();
  for (const NamedHistogram& entry : f.gathered.activations)
    activations.push_back(histogram_json("layer", entry));
  nlohmann::json weights = nlohmann::json::array();
  for (const NamedHistogram& entry : f.gathered.weights)
    weights.push_back(histogram_json("tensor", entry));
  const ScaleRecommendation& r = f.recommendation;
  return {{"config", f.config_path},
          {"name", f.name},
          {"precision", f.precision},
          {"device", f.device},
          {"steps", f.steps},
          {"skipped_steps", f.skipped_steps},
          {"batches", f.batches},
          {"scale", f.scale},
          {"scale_note", f.scale_note},
          {"recommended_scale", r.scale},
          {"recommendation",
           {{"log2", r.log2_scale},
            {"meets_target", r.meets_target},
            {"target", r.target},
            {"nonzero", r.nonzero},
            {"flushed", r.flushed},
            {"overflowed", r.overflowed},
            {"representable_fraction", r.representable_fraction}}},
          {"fp16",
           {{"max", fp16_max()}, {"min_normal", fp16_min_normal()},
            {"min_subnormal", fp16_min_subnormal()}}},
          {"activations", std::move(activations)},
          {"weights", std::move(weights)},
          {"at_risk", at_risk_names(f)}};
}

std::string inspect_summary(const InspectFindings& f) {
  std::ostringstream out;
  out << "mixprec inspect: " << f.name << " (" << f.precision << ", " << f.device << "), after "
      << f.steps << " optimizer steps";
  if (f.skipped_steps > 0) out << " (" << f.skipped_steps << " skipped)";
  out << "; the gradients of " << f.batches << (f.batches == 1 ? " batch" : " batches")
      << " measured in FP32 with the unscaled loss.\n"
      << "FP16: largest finite 65504, normals from 2^-14, subnormals down to 2^-24; "
         "|g| <= 2^-25 flushes to zero.\n"
      << "Loss scale S = " << scale_text(f.scale) << ": " << f.scale_note << "\n\n";
  overall_line(out, "Activation gradients", f.gathered.activations, f.scale);
  overall_line(out, "Weight gradients", f.gathered.weights, f.scale);

  const std::vector<std::string> risky = at_risk_names(f);
  out << "\n";
  if (risky.empty()) {
    out << "No layer or tensor loses more than " << percent(kAtRiskFraction)
        << " of its non-zero gradient values to zero in FP16 without scaling.\n";
  } else {
    out << "At risk (more than " << percent(kAtRiskFraction)
        << " of the non-zero values flush to zero in FP16 without scaling):\n";
    char line[256];
    std::snprintf(line, sizeof line, "  %-36s %12s %12s %12s %12s\n", "layer / tensor",
                  "flushed", "subnormal", "flushed xS", "overflow xS");
    out << line;
    for (const auto* group : {&f.gathered.activations, &f.gathered.weights}) {
      for (const NamedHistogram& entry : *group) {
        const GradHistogram& h = entry.histogram;
        if (h.underflow_fraction_unscaled() <= kAtRiskFraction) continue;
        const std::string name =
            (group == &f.gathered.weights ? "" : "layer ") + entry.name;
        std::snprintf(line, sizeof line, "  %-36s %12s %12s %12s %12s\n", name.c_str(),
                      percent(h.underflow_fraction_unscaled()).c_str(),
                      percent(h.subnormal_fraction_unscaled()).c_str(),
                      percent(h.underflow_fraction_scaled()).c_str(),
                      percent(h.overflow_fraction_scaled()).c_str());
        out << line;
      }
    }
  }

  const ScaleRecommendation& r = f.recommendation;
  out << "\n";
  if (r.nonzero == 0) {
    out << "Every gathered gradient is zero: there is nothing to scale (recommended S = 1).\n";
  } else if (r.meets_target) {
    out << "Recommended scale: " << scale_text(r.scale) << ", the smallest power of two under "
        << "which at least " << percent(r.target) << " of the non-zero gradients fit FP16 ("
        << percent(r.representable_fraction) << " do, none overflows).\n";
  } else {
    out << "No power of two from 2^-24 to 2^40 keeps " << percent(r.target)
        << " of the non-zero gradients in FP16 without overflow; the best is "
        << scale_text(r.scale) << ", with " << percent(r.representable_fraction)
        << " representable (" << r.flushed << " flushed, " << r.overflowed
        << " overflowing): the gradients span more than FP16's range.\n";
  }
  return out.str();
}

std::vector<ChartResult> write_inspect_charts(const std::string& dir,
                                              const InspectFindings& findings) {
  return {write_chart(dir, "activation_gradients", "activation gradients",
                      findings.gathered.activations, findings),
          write_chart(dir, "weight_gradients", "weight gradients", findings.gathered.weights,
                      findings)};
}

}  // namespace mixprec::inspect
