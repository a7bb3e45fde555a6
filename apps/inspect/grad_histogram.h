// The numbers behind `mixprec inspect`: log2 histograms of gradient magnitudes, what FP16
// would make of each value with and without a loss scale, and the smallest power-of-two scale
// that keeps a sample of gradients inside FP16's range. Pure functions over floats, so every
// count can be worked out by hand.
//
// FP16 (core/half.h, round-to-nearest-even with subnormals): the largest finite value is
// 65504 and |x| >= 65520 rounds to infinity; normals start at 2^-14; subnormals go down to
// 2^-24, and |x| <= 2^-25 rounds to zero (2^-25 itself is a tie that goes to the even zero).
#pragma once

#include <array>
#include <cstdint>
#include <span>

namespace mixprec::inspect {

// Bins [2^k, 2^(k+1)) for k = kLowestBinLog2 .. kHighestBinLog2, i.e. k = floor(log2 |g|).
inline constexpr int kLowestBinLog2 = -40;
inline constexpr int kHighestBinLog2 = 19;  // the last bin ends at 2^20
inline constexpr int kBinCount = kHighestBinLog2 - kLowestBinLog2 + 1;

// Statistics of a set of gradient values under one loss scale S. Every value is counted
// exactly once among zeros, bins, underflow_bin and overflow_bin, so those sum to elements.
struct GradHistogram {
  double scale = 1.0;  // the S of the *_scaled counts
  int64_t elements = 0;
  int64_t zeros = 0;                    // +0 and -0
  std::array<int64_t, kBinCount> bins{};  // bins[k - kLowestBinLog2]: floor(log2 |g|) == k
  int64_t underflow_bin = 0;            // 0 < |g| < 2^-40
  int64_t overflow_bin = 0;             // |g| >= 2^20, infinities and NaN
  // Among the non-zero values:
  int64_t flushed_unscaled = 0;    // g converts to an FP16 zero
  int64_t subnormal_unscaled = 0;  // g converts to an FP16 subnormal (not zero)
  int64_t flushed_scaled = 0;      // g * S converts to an FP16 zero
  int64_t overflow_scaled = 0;     // g * S converts to an FP16 infinity (or g is NaN)

  int64_t nonzero() const { return elements - zeros; }
  // Each count above over nonzero(); 0 when there is no non-zero value.
  double underflow_fraction_unscaled() const;
  double subnormal_fraction_unscaled() const;
  double underflow_fraction_scaled() const;
  double overflow_fraction_scaled() const;
};

// An empty histogram for loss scale `scale` (> 0, finite; throws mixprec::Error otherwise).
GradHistogram make_grad_histogram(double scale);

// Counts every value of `values` into `histogram`. g * S is the product rounded once to FP32
// (exact when S is a power of two), then converted to FP16 by float_to_half_bits.
void add_values(GradHistogram& histogram, std::span<const float> values);

// The FP16 fate of every non-zero value under every power-of-two scale, in one pass: values
// are grouped by FP32 exponent field and by significand m (|g| = m * 2^e, 1 <= m < 2): m = 1
// (2^e * 2^k can be the tie 2^-25 that rounds to zero), m >= 2 - 2^-11 (2^15 * m rounds up to
// 65520 and overflows), or in between. Within a group every value flushes or overflows
// under the same scales, so one representative per group, converted by float_to_half_bits,
// decides for the whole group. Exact for scales 2^k with |k| <= 100.
class ScaleProfile {
 public:
  void add(std::span<const float> values);
  void merge(const ScaleProfile& other);
  int64_t nonzero() const { return nonzero_; }

  struct Outcome {
    int64_t flushed = 0;     // non-zero values whose g * 2^k converts to an FP16 zero
    int64_t overflowed = 0;  // values whose g * 2^k converts to an FP16 infinity or is NaN
  };
  // Throws mixprec::Error for |log2_scale| > 100.
  Outcome outcome(int log2_scale) const;

 private:
  std::array<std::array<int64_t, 3>, 256> counts_{};  // [FP32 exponent field][mantissa group]
  int64_t nonzero_ = 0;
};

struct ScaleRecommendation {
  int log2_scale = 0;
  double scale = 1.0;            // 2^log2_scale
  bool meets_target = false;     // representable_fraction >= target and nothing overflows
  double target = 0.999;
  int64_t nonzero = 0;           // the values considered
  int64_t flushed = 0;           // under the recommended scale
  int64_t overflowed = 0;
  double representable_fraction = 1.0;  // (nonzero - flushed - overflowed) / nonzero
};

// The smallest S = 2^k, min_log2 <= k <= max_log2, under which at least `target` of the
// profile's non-zero values are representable in FP16 (neither flushed to zero nor
// overflowing) and none overflows. When no k qualifies (meets_target false): the k with the
// largest representable fraction, then the fewest overflows, then the smallest k. Without
// any non-zero value: S = 1, meets_target true. Throws mixprec::Error for target outside
// (0, 1] or an empty or out-of-range k interval.
ScaleRecommendation recommend_scale(const ScaleProfile& profile, double target = 0.999,
                                    int min_log2 = -24, int max_log2 = 40);

}  // namespace mixprec::inspect
