// Histogram and scale arithmetic of `mixprec inspect`. Every FP16 verdict comes from
// core/half.h's conversion itself rather than from thresholds written here, so the report
// says what the framework's FP16 would really do with each value.
#include "apps/inspect/grad_histogram.h"

#include <cmath>

#include "core/error.h"
#include "core/half.h"

namespace mixprec::inspect {
namespace {

double fraction(int64_t count, int64_t of) {
  return of > 0 ? static_cast<double>(count) / static_cast<double>(of) : 0.0;
}

bool half_is_zero(uint16_t bits) { return (bits & 0x7FFFu) == 0; }
bool half_is_nonfinite(uint16_t bits) { return (bits & 0x7C00u) == 0x7C00u; }
bool half_is_subnormal(uint16_t bits) {
  return (bits & 0x7C00u) == 0 && (bits & 0x03FFu) != 0;
}

// The significand group of ScaleProfile: 0 for m = 1, 2 for m >= 2 - 2^-11 (mantissa field
// 0x7FF000 and up: 2^15 * m >= 65520), 1 in between.
constexpr uint32_t kTopMantissa = 0x7FF000u;

int mantissa_group(uint32_t mantissa) {
  if (mantissa == 0) return 0;
  return mantissa >= kTopMantissa ? 2 : 1;
}

// A value of the group: the extremes of the middle group behave like all of it.
float group_representative(uint32_t exponent_field, int group) {
  const uint32_t mantissa = group == 0 ? 0u : group == 1 ? 1u : 0x7FFFFFu;
  return detail::f32_from_bits((exponent_field << 23) | mantissa);
}

}  // namespace

double GradHistogram::underflow_fraction_unscaled() const {
  return fraction(flushed_unscaled, nonzero());
}
double GradHistogram::subnormal_fraction_unscaled() const {
  return fraction(subnormal_unscaled, nonzero());
}
double GradHistogram::underflow_fraction_scaled() const {
  return fraction(flushed_scaled, nonzero());
}
double GradHistogram::overflow_fraction_scaled() const {
  return fraction(overflow_scaled, nonzero());
}

GradHistogram make_grad_histogram(double scale) {
  MIXPREC_CHECK(std::isfinite(scale) && scale > 0.0,
                "inspect: the loss scale must be a positive finite number, got ", scale);
  GradHistogram histogram;
  histogram.scale = scale;
  return histogram;
}

void add_values(GradHistogram& h, std::span<const float> values) {
  const float scale = static_cast<float>(h.scale);
  for (const float g : values) {
    ++h.elements;
    if (g == 0.0f) {
      ++h.zeros;
      continue;
    }
    if (!std::isfinite(g)) {
      ++h.overflow_bin;
    } else {
      const int k = std::ilogb(g);  // floor(log2 |g|), exact for subnormal floats too
      if (k < kLowestBinLog2) {
        ++h.underflow_bin;
      } else if (k > kHighestBinLog2) {
        ++h.overflow_bin;
      } else {
        ++h.bins[static_cast<size_t>(k - kLowestBinLog2)];
      }
    }
    const uint16_t unscaled = float_to_half_bits(g);
    if (half_is_zero(unscaled)) ++h.flushed_unscaled;
    if (half_is_subnormal(unscaled)) ++h.subnormal_unscaled;
    const uint16_t scaled = float_to_half_bits(g * scale);
    if (half_is_zero(scaled)) ++h.flushed_scaled;
    if (half_is_nonfinite(scaled)) ++h.overflow_scaled;
  }
}

void ScaleProfile::add(std::span<const float> values) {
  for (const float g : values) {
    const uint32_t bits = detail::f32_to_bits(g) & 0x7FFFFFFFu;
    if (bits == 0) continue;
    ++counts_[bits >> 23][static_cast<size_t>(mantissa_group(bits & 0x7FFFFFu))];
    ++nonzero_;
  }
}

void ScaleProfile::merge(const ScaleProfile& other) {
  for (size_t e = 0; e < counts_.size(); ++e)
    for (size_t g = 0; g < counts_[e].size(); ++g) counts_[e][g] += other.counts_[e][g];
  nonzero_ += other.nonzero_;
}

ScaleProfile::Outcome ScaleProfile::outcome(int log2_scale) const {
  // Beyond 2^100 a float subnormal (exponent field 0) could be scaled into FP16's range, and
  // its group would no longer act as one.
  MIXPREC_CHECK(log2_scale >= -100 && log2_scale <= 100,
                "inspect: scales beyond 2^+-100 are not supported, got 2^", log2_scale);
  Outcome out;
  for (uint32_t e = 0; e < counts_.size(); ++e) {
    for (int group = 0; group < 3; ++group) {
      const int64_t count = counts_[e][static_cast<size_t>(group)];
      if (count == 0) continue;
      // Multiplying by a power of two is exact in FP32 unless the result leaves FP32's
      // range, and then it is far outside FP16's too, on the same side.
      const float scaled = std::ldexp(group_representative(e, group), log2_scale);
      const uint16_t bits = float_to_half_bits(scaled);
      if (half_is_zero(bits)) out.flushed += count;
      if (half_is_nonfinite(bits)) out.overflowed += count;
    }
  }
  return out;
}

ScaleRecommendation recommend_scale(const ScaleProfile& profile, double target, int min_log2,
                                    int max_log2) {
  MIXPREC_CHECK(target > 0.0 && target <= 1.0, "inspect: the representable target must be in "
                "(0, 1], got ", target);
  MIXPREC_CHECK(min_log2 <= max_log2 && min_log2 >= -100 && max_log2 <= 100,
                "inspect: the scales 2^", min_log2, " .. 2^", max_log2,
                " are not an interval within 2^-100 .. 2^100");
  ScaleRecommendation best;
  best.target = target;
  best.nonzero = profile.nonzero();
  if (profile.nonzero() == 0) {
    best.meets_target = true;
    return best;
  }
  bool have_best = false;
  for (int k = min_log2; k <= max_log2; ++k) {
    const ScaleProfile::Outcome o = profile.outcome(k);
    ScaleRecommendation candidate = best;
    candidate.log2_scale = k;
    candidate.scale = std::ldexp(1.0, k);
    candidate.flushed = o.flushed;
    candidate.overflowed = o.overflowed;
    candidate.representable_fraction =
        fraction(profile.nonzero() - o.flushed - o.overflowed, profile.nonzero());
    candidate.meets_target = o.overflowed == 0 && candidate.representable_fraction >= target;
    if (candidate.meets_target) return candidate;  // the smallest k that qualifies
    const bool better =
        !have_best || candidate.representable_fraction > best.representable_fraction ||
        (candidate.representable_fraction == best.representable_fraction &&
         candidate.overflowed < best.overflowed);
    if (better) {
      best = candidate;
      have_best = true;
    }
  }
  return best;
}

}  // namespace mixprec::inspect
