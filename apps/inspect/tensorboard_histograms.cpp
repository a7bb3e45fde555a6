#include "apps/inspect/tensorboard_histograms.h"

#include <utility>
#include <vector>

namespace mixprec::inspect {

std::optional<tensorboard::Histogram> log2_histogram(const GradHistogram& histogram) {
  // Buckets by upper edge: the underflow bin, the log2 bins, the overflow bin.
  std::vector<std::pair<double, int64_t>> buckets;
  buckets.emplace_back(kLowestBinLog2, histogram.underflow_bin);
  for (int k = kLowestBinLog2; k <= kHighestBinLog2; ++k)
    buckets.emplace_back(k + 1, histogram.bins[static_cast<size_t>(k - kLowestBinLog2)]);
  buckets.emplace_back(kHighestBinLog2 + 2, histogram.overflow_bin);

  size_t first = buckets.size(), last = 0;
  for (size_t i = 0; i < buckets.size(); ++i) {
    if (buckets[i].second == 0) continue;
    if (first == buckets.size()) first = i;
    last = i;
  }
  if (first == buckets.size()) return std::nullopt;

  tensorboard::Histogram out;
  out.min = buckets[first].first - 1.0;
  out.max = buckets[last].first;
  for (size_t i = first; i <= last; ++i) {
    const auto count = static_cast<double>(buckets[i].second);
    const double centre = buckets[i].first - 0.5;
    out.limits.push_back(buckets[i].first);
    out.counts.push_back(count);
    out.num += count;
    out.sum += count * centre;
    out.sum_squares += count * centre * centre;
  }
  return out;
}

std::string write_tensorboard_histograms(const std::string& dir, const InspectFindings& findings) {
  std::vector<std::pair<std::string, tensorboard::Histogram>> histograms;
  const auto add = [&histograms](const std::string& tag, const GradHistogram& histogram) {
    if (std::optional<tensorboard::Histogram> h = log2_histogram(histogram))
      histograms.emplace_back(tag, std::move(*h));
  };
  for (const NamedHistogram& layer : findings.gathered.activations)
    add("grad_log2/activation/" + layer.name, layer.histogram);
  for (const NamedHistogram& weight : findings.gathered.weights)
    add("grad_log2/weight/" + weight.name, weight.histogram);
  tensorboard::EventFileWriter file(dir);
  file.write_histograms(findings.steps, histograms);
  return file.path();
}

}  // namespace mixprec::inspect
