#include "apps/sample/token_choice.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/philox.h"

namespace mixprec {

int32_t choose_token(std::span<const float> logits, const TokenChoice& choice, double u) {
  MIXPREC_CHECK(!logits.empty(), "sample: no logits to choose from");
  MIXPREC_CHECK(std::isfinite(choice.temperature) && choice.temperature > 0.0,
                "sample: temperature must be a number > 0, got ", choice.temperature);
  MIXPREC_CHECK(choice.top_k >= 1, "sample: top_k must be >= 1, got ", choice.top_k);
  for (size_t i = 0; i < logits.size(); ++i) {
    MIXPREC_CHECK(!std::isnan(logits[i]) && logits[i] != std::numeric_limits<float>::infinity(),
                  "sample: the model's logit for token ", i, " is ", logits[i],
                  " (the weights or the precision overflowed)");
  }
  const size_t n = logits.size();
  const size_t k = static_cast<size_t>(std::min<int64_t>(choice.top_k, static_cast<int64_t>(n)));
  std::vector<float> sorted(logits.begin(), logits.end());
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(k - 1),
                   sorted.end(), std::greater<float>());
  const float kth = sorted[k - 1];
  const float largest = *std::max_element(logits.begin(), logits.end());
  MIXPREC_CHECK(std::isfinite(largest), "sample: every logit is -inf");

  std::vector<double> weights(n, 0.0);
  double total = 0.0;
  for (size_t i = 0; i < n; ++i) {
    if (logits[i] < kth || !std::isfinite(logits[i])) continue;
    weights[i] = std::exp((static_cast<double>(logits[i]) - largest) / choice.temperature);
    total += weights[i];
  }
  const double target = u * total;
  double cumulative = 0.0;
  size_t last_kept = 0;
  for (size_t i = 0; i < n; ++i) {
    if (weights[i] == 0.0) continue;
    cumulative += weights[i];
    last_kept = i;
    if (target < cumulative) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(last_kept);  // u * total rounded up to the total
}

double token_uniform(uint64_t seed, uint64_t index) {
  const Philox4 words = philox4x32(seed, index);
  const uint64_t bits = (static_cast<uint64_t>(words.v[0]) << 21) ^ (words.v[1] >> 11);
  return static_cast<double>(bits & ((uint64_t{1} << 53) - 1)) * 0x1p-53;
}

}  // namespace mixprec
