#include "dist/reduction.h"

#include <cmath>
#include <limits>

namespace mixprec::dist {

Shard shard_of(int64_t numel, int parts, int index) {
  const int64_t begin = numel * index / parts;
  const int64_t end = numel * (index + 1) / parts;
  return {begin, end - begin};
}

void add_in_rank_order(const float* runs, int parts, int64_t size, float* out) {
  for (int64_t i = 0; i < size; ++i) out[i] = +0.0f;
  // Rank by rank: the loop over elements may be vectorised, but each element's additions
  // stay in rank order (no -ffast-math: the compiler may not reassociate them).
  for (int q = 0; q < parts; ++q) {
    const float* run = runs + static_cast<int64_t>(q) * size;
    for (int64_t i = 0; i < size; ++i) out[i] = out[i] + run[i];
  }
}

float max_nan_wins(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<float>::quiet_NaN();
  // Equal numbers: the same bits, or +0 and -0, of which +0 is the larger.
  if (a == b) return std::signbit(a) ? b : a;
  return a > b ? a : b;
}

}  // namespace mixprec::dist
