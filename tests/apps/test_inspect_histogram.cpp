// The arithmetic of `mixprec inspect`: log2 bins, FP16 flush/overflow fractions with and
// without a loss scale, and the recommended scale, on values whose fate is worked out by
// hand from FP16's limits (normals from 2^-14, subnormals down to 2^-24, |x| <= 2^-25 rounds
// to zero with 2^-25 a tie to the even zero, |x| >= 65520 rounds to infinity).
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "apps/inspect/grad_histogram.h"
#include "core/error.h"
#include "core/half.h"

using namespace mixprec;
using namespace mixprec::inspect;

namespace {

int64_t bin(const GradHistogram& h, int log2) {
  return h.bins.at(static_cast<size_t>(log2 - kLowestBinLog2));
}

int64_t bins_total(const GradHistogram& h) {
  int64_t sum = 0;
  for (int64_t count : h.bins) sum += count;
  return sum;
}

GradHistogram histogram_of(const std::vector<float>& values, double scale) {
  GradHistogram h = make_grad_histogram(scale);
  add_values(h, values);
  return h;
}

// 2^-26, -2^-25, 3 * 2^-26, 2^-24, 1, -70000 and two zeros.
const std::vector<float> kSample = {0x1p-26f, -0x1p-25f, 0x3p-26f, 0x1p-24f, 1.0f, -70000.0f,
                                    0.0f, -0.0f};

}  // namespace

TEST_CASE("inspect: FP16 flush and overflow fractions of hand-worked values", "[inspect]") {
  SECTION("without scaling") {
    const GradHistogram h = histogram_of(kSample, 1.0);
    CHECK(h.elements == 8);
    CHECK(h.zeros == 2);
    CHECK(h.nonzero() == 6);
    // 2^-26 is below the midpoint 2^-25 and 2^-25 is the tie: both flush. 3 * 2^-26 lies
    // above the tie and rounds to 2^-24, a subnormal like 2^-24 itself.
    CHECK(h.flushed_unscaled == 2);
    CHECK(h.subnormal_unscaled == 2);
    CHECK(h.underflow_fraction_unscaled() == 2.0 / 6.0);
    CHECK(h.subnormal_fraction_unscaled() == 2.0 / 6.0);
    // S = 1: the same flushes, and 70000 >= 65520 overflows.
    CHECK(h.underflow_fraction_scaled() == 2.0 / 6.0);
    CHECK(h.overflow_fraction_scaled() == 1.0 / 6.0);
  }
  SECTION("with S = 2^10") {
    const GradHistogram h = histogram_of(kSample, 1024.0);
    // 2^-16, 2^-15, 3 * 2^-16 and 2^-14 are all representable; 1024 too; 70000 * 1024 is not.
    CHECK(h.underflow_fraction_unscaled() == 2.0 / 6.0);  // the unscaled view does not move
    CHECK(h.flushed_scaled == 0);
    CHECK(h.underflow_fraction_scaled() == 0.0);
    CHECK(h.overflow_scaled == 1);
    CHECK(h.overflow_fraction_scaled() == 1.0 / 6.0);
  }
  SECTION("with S = 2^-2") {
    const GradHistogram h = histogram_of(kSample, 0.25);
    // 2^-28, 2^-27, 3 * 2^-28 (below the tie 2^-25) and 2^-26 flush; 1/4 and 17500 fit.
    CHECK(h.flushed_scaled == 4);
    CHECK(h.overflow_scaled == 0);
    CHECK(h.underflow_fraction_scaled() == 4.0 / 6.0);
  }
  SECTION("no non-zero value gives fractions of 0") {
    const GradHistogram h = histogram_of({0.0f, -0.0f}, 1.0);
    CHECK(h.nonzero() == 0);
    CHECK(h.underflow_fraction_unscaled() == 0.0);
    CHECK(h.overflow_fraction_scaled() == 0.0);
  }
}

TEST_CASE("inspect: log2 bins count every value once in the right bin", "[inspect]") {
  GradHistogram h = histogram_of(kSample, 1.0);
  CHECK(bin(h, -26) == 1);
  CHECK(bin(h, -25) == 2);  // 2^-25 and 3 * 2^-26 = 1.5 * 2^-25
  CHECK(bin(h, -24) == 1);
  CHECK(bin(h, 0) == 1);
  CHECK(bin(h, 16) == 1);  // 65536 <= 70000 < 131072
  CHECK(bins_total(h) == 6);
  CHECK(h.underflow_bin == 0);
  CHECK(h.overflow_bin == 0);

  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // 2^-40 is the first bin, 2^-41 and a float subnormal are below it; 2^20 - 2^-4 (the float
  // just below 2^20) is the last bin, 2^20, infinities and NaN are above it.
  add_values(h, std::vector<float>{0x1p-40f, 0x1p-41f, 1e-45f, 0x1p20f - 0x1p-4f, 0x1p20f, inf,
                                   -inf, nan});
  CHECK(h.elements == 16);
  CHECK(bin(h, -40) == 1);
  CHECK(bin(h, 19) == 1);
  CHECK(h.underflow_bin == 2);
  CHECK(h.overflow_bin == 4);
  CHECK(bins_total(h) + h.zeros + h.underflow_bin + h.overflow_bin == h.elements);
  // The three tiny values flush; infinities and NaN count as overflow under S.
  CHECK(h.flushed_unscaled == 2 + 3);
  CHECK(h.overflow_scaled == 1 + 1 + 4);  // -70000, 2^20 - 2^-4 (>= 65520), 2^20, inf, -inf, NaN
}

TEST_CASE("inspect: histogram counts sum to the elements of a random sample", "[inspect]") {
  std::mt19937 rng(17);
  std::uniform_real_distribution<double> exponent(-60.0, 30.0);
  std::vector<float> values(5000);
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = i % 7 == 0 ? 0.0f
                           : static_cast<float>((i % 2 ? -1.0 : 1.0) * std::exp2(exponent(rng)));
  const GradHistogram h = histogram_of(values, 4096.0);
  CHECK(h.elements == 5000);
  CHECK(bins_total(h) + h.zeros + h.underflow_bin + h.overflow_bin == h.elements);
  // Each value's bin is floor(log2 |g|), counted here with double-precision log2.
  std::vector<int64_t> expected(kBinCount, 0);
  int64_t below = 0, above = 0;
  for (float v : values) {
    if (v == 0.0f) continue;
    const int k = static_cast<int>(std::floor(std::log2(std::fabs(static_cast<double>(v)))));
    if (k < kLowestBinLog2) ++below;
    else if (k > kHighestBinLog2) ++above;
    else ++expected[static_cast<size_t>(k - kLowestBinLog2)];
  }
  for (int k = kLowestBinLog2; k <= kHighestBinLog2; ++k) {
    INFO("bin " << k);
    CHECK(bin(h, k) == expected[static_cast<size_t>(k - kLowestBinLog2)]);
  }
  CHECK(h.underflow_bin == below);
  CHECK(h.overflow_bin == above);
}

TEST_CASE("inspect: a histogram's scale must be positive and finite", "[inspect]") {
  CHECK_THROWS_AS(make_grad_histogram(0.0), Error);
  CHECK_THROWS_AS(make_grad_histogram(-2.0), Error);
  CHECK_THROWS_AS(make_grad_histogram(std::numeric_limits<double>::infinity()), Error);
}

TEST_CASE("inspect: the scale profile agrees with converting every value at every scale",
          "[inspect]") {
  // Values at every FP32 exponent with significands at the group edges, plus random ones,
  // subnormal floats, infinities and NaN.
  std::vector<float> values;
  for (int e = -149; e <= 127; ++e)
    for (double m : {1.0, 1.0 + 0x1p-23, 1.5, 2.0 - 0x1p-11 - 0x1p-23, 2.0 - 0x1p-11,
                     2.0 - 0x1p-23}) {
      const float v = static_cast<float>(std::ldexp(m, e));
      if (v != 0.0f && std::isfinite(v)) values.push_back(e % 2 ? -v : v);
    }
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 2000; ++i) values.push_back(detail::f32_from_bits(bits(rng)));
  values.push_back(std::numeric_limits<float>::infinity());
  values.push_back(std::numeric_limits<float>::quiet_NaN());
  values.push_back(0.0f);

  ScaleProfile profile;
  profile.add(values);
  int64_t nonzero = 0;
  for (float v : values) nonzero += v != 0.0f;
  CHECK(profile.nonzero() == nonzero);
  for (int k = -24; k <= 40; ++k) {
    int64_t flushed = 0, overflowed = 0;
    for (float v : values) {
      if (v == 0.0f) continue;
      const float scaled = static_cast<float>(std::ldexp(static_cast<double>(v), k));
      const uint16_t h = float_to_half_bits(scaled);
      if ((h & 0x7FFF) == 0) ++flushed;
      if ((h & 0x7C00) == 0x7C00) ++overflowed;
    }
    const ScaleProfile::Outcome o = profile.outcome(k);
    INFO("k = " << k);
    CHECK(o.flushed == flushed);
    CHECK(o.overflowed == overflowed);
  }
}

TEST_CASE("inspect: the recommended scale on hand-built samples", "[inspect]") {
  SECTION("999 values at 2^-30 and one at 2^-40") {
    ScaleProfile profile;
    profile.add(std::vector<float>(999, 0x1p-30f));
    profile.add(std::vector<float>{-0x1p-40f});
    // 2^-30 * 2^5 is the tie 2^-25, which flushes; 2^6 brings 999 of 1000 values to 2^-24.
    ScaleRecommendation r = recommend_scale(profile);
    CHECK(r.meets_target);
    CHECK(r.log2_scale == 6);
    CHECK(r.scale == 64.0);
    CHECK(r.flushed == 1);
    CHECK(r.overflowed == 0);
    CHECK(r.representable_fraction == 0.999);
    // Keeping the 2^-40 value too takes 2^16 (2^-40 * 2^15 is again the tie).
    r = recommend_scale(profile, 1.0);
    CHECK(r.meets_target);
    CHECK(r.log2_scale == 16);
    CHECK(r.flushed == 0);
  }
  SECTION("a scale below 1 when the largest value would overflow") {
    ScaleProfile profile;
    profile.add(std::vector<float>{0x1p-20f, 60000.0f});
    // 2^-20 needs k >= -4 to reach 2^-24; 60000 * 2 = 120000 overflows, so k <= 0.
    const ScaleRecommendation r = recommend_scale(profile);
    CHECK(r.meets_target);
    CHECK(r.log2_scale == -4);
    CHECK(r.scale == 0.0625);
  }
  SECTION("no scale fits a range wider than FP16's") {
    ScaleProfile profile;
    profile.add(std::vector<float>(6, 0x1p-30f));
    profile.add(std::vector<float>(4, 0x1p18f));
    // k <= -3 keeps the four 2^18 (2^18 * 2^-2 = 65536 overflows) and flushes the six;
    // k >= 6 keeps the six and overflows the four; in between both are lost.
    const ScaleRecommendation r = recommend_scale(profile);
    CHECK_FALSE(r.meets_target);
    CHECK(r.log2_scale == 6);
    CHECK(r.representable_fraction == 0.6);
    CHECK(r.flushed == 0);
    CHECK(r.overflowed == 4);
  }
  SECTION("nothing to scale") {
    ScaleProfile profile;
    profile.add(std::vector<float>{0.0f, -0.0f});
    const ScaleRecommendation r = recommend_scale(profile);
    CHECK(r.meets_target);
    CHECK(r.scale == 1.0);
    CHECK(r.nonzero == 0);
  }
  SECTION("bad arguments") {
    ScaleProfile profile;
    CHECK_THROWS_AS(recommend_scale(profile, 0.0), Error);
    CHECK_THROWS_AS(recommend_scale(profile, 0.999, 5, 4), Error);
    CHECK_THROWS_AS(profile.outcome(101), Error);
  }
}
