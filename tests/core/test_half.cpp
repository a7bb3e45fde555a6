// FP16/BF16 scalar conversions (core/half.h) and bulk conversions (core/convert.h).
//
// The scalar functions are checked against two independent references: the x86 hardware
// instructions (when this CPU has them) and a table-based round-to-nearest-even in double
// arithmetic that knows nothing of the bit tricks under test. The bulk paths are then checked
// bit-for-bit against the scalar ones.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/convert.h"
#include "core/half.h"

#if defined(__x86_64__) || defined(__i386__)
#define MIXPREC_TEST_X86 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define MIXPREC_TEST_X86 0
#endif

namespace {

using mixprec::bf16_bits_to_float;
using mixprec::bfloat16;
using mixprec::float_to_bf16_bits;
using mixprec::float_to_half_bits;
using mixprec::half;
using mixprec::half_bits_to_float;

constexpr uint32_t kSeed = 20240611;

uint32_t bits32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

bool is_nan_bits(uint32_t u) { return (u & 0x7FFFFFFFu) > 0x7F800000u; }

std::string hex(uint32_t v) {
  std::ostringstream out;
  out << "0x" << std::hex << v;
  return out.str();
}

// Counts failures of a per-element check and keeps the first few for the report, so that a
// million-element sweep costs one assertion and still says which inputs failed.
struct Mismatches {
  size_t count = 0;
  std::string examples;

  void add(const std::string& what) {
    if (count++ < 8) examples += what + "\n";
  }
};

// --- Independent references -------------------------------------------------------------

// The value of a non-negative 16-bit pattern, from the format's definition. The infinity
// pattern maps to the next power of two: IEEE rounds as if the exponent range were unbounded,
// so that is the upper neighbour of the largest finite value.
double half_value_ref(uint16_t b) {
  const int e = b >> 10, m = b & 0x3FF;
  if (e == 0x1F) return std::ldexp(1.0, 16);
  if (e == 0) return std::ldexp(m, -24);
  return std::ldexp(1024 + m, e - 25);
}

double bf16_value_ref(uint16_t b) {
  const int e = b >> 7, m = b & 0x7F;
  if (e == 0xFF) return std::ldexp(1.0, 128);
  if (e == 0) return std::ldexp(m, -133);
  return std::ldexp(128 + m, e - 134);
}

// Ascending values of all non-negative finite patterns plus infinity; index == bit pattern.
struct RoundingTable {
  std::vector<double> values;
  uint16_t inf_bits;

  RoundingTable(uint16_t inf, double (*value_of)(uint16_t)) : inf_bits(inf) {
    for (uint32_t b = 0; b <= inf; ++b) values.push_back(value_of(static_cast<uint16_t>(b)));
  }

  // Round-to-nearest-even of a finite float: find the two neighbours, take the nearer, on a
  // tie the one with an even pattern. Differences are exact in double: every value involved
  // is a multiple of 2^-149 spanning fewer than 53 bits.
  uint16_t round(float x) const {
    const double a = std::fabs(static_cast<double>(x));
    const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    if (a >= values.back()) return sign | inf_bits;
    const size_t hi = std::upper_bound(values.begin(), values.end(), a) - values.begin();
    const size_t lo = hi - 1;
    const double below = a - values[lo], above = values[hi] - a;
    size_t pick = below < above ? lo : above < below ? hi : (lo % 2 == 0 ? lo : hi);
    return static_cast<uint16_t>(sign | pick);
  }
};

const RoundingTable& half_table() {
  static const RoundingTable table(0x7C00, half_value_ref);
  return table;
}

const RoundingTable& bf16_table() {
  static const RoundingTable table(0x7F80, bf16_value_ref);
  return table;
}

// The documented NaN results (core/half.h).
uint16_t half_nan_ref(uint32_t u) {
  return static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7E00u | ((u >> 13) & 0x3FFu));
}
uint16_t bf16_nan_ref(uint32_t u) { return static_cast<uint16_t>((u >> 16) | 0x40u); }

uint16_t half_ref(float x) {
  return is_nan_bits(bits32(x)) ? half_nan_ref(bits32(x)) : half_table().round(x);
}
uint16_t bf16_ref(float x) {
  return is_nan_bits(bits32(x)) ? bf16_nan_ref(bits32(x)) : bf16_table().round(x);
}

// --- Hardware references ----------------------------------------------------------------

#if MIXPREC_TEST_X86
bool cpu_has(const char* what) {
  __builtin_cpu_init();
  if (std::string(what) == "f16c") {
#if defined(__clang__)
    // Older clang rejects "f16c" in __builtin_cpu_supports; CPUID leaf 1 has the bit.
    unsigned eax, ebx, ecx, edx;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) &&
           (ecx & bit_F16C) != 0;
#else
    return __builtin_cpu_supports("f16c");
#endif
  }
  if (std::string(what) == "avx512bf16") {
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512f");
  }
  return false;
}

__attribute__((target("f16c"))) uint16_t hw_float_to_half(float x) {
  return static_cast<uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
}

__attribute__((target("f16c"))) float hw_half_to_float(uint16_t h) { return _cvtsh_ss(h); }

// vcvtneps2bf16 rounds to nearest-even but flushes subnormals, so it is a reference only for
// normal inputs. 16 at a time: the scalar intrinsic's return type differs between compilers.
__attribute__((target("avx512f,avx512bf16"))) void hw_float_to_bf16_16(const float* src,
                                                                       uint16_t* dst) {
  const __m256bh r = _mm512_cvtneps_pbh(_mm512_loadu_ps(src));
  std::memcpy(dst, &r, 16 * sizeof(uint16_t));
}
#else
bool cpu_has(const char*) { return false; }
uint16_t hw_float_to_half(float) { return 0; }
float hw_half_to_float(uint16_t) { return 0; }
void hw_float_to_bf16_16(const float*, uint16_t*) {}
#endif

// --- Test inputs ------------------------------------------------------------------------

// Random 32-bit patterns: every exponent (subnormals, infinities, NaNs) turns up.
std::vector<float> random_patterns(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> out(n);
  for (auto& x : out) x = float_of(static_cast<uint32_t>(rng()));
  return out;
}

// Random sign and mantissa with the unbiased exponent uniform in [lo, hi].
std::vector<float> random_in_exponents(size_t n, int lo, int hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> exp(lo, hi);
  std::vector<float> out(n);
  for (auto& x : out) {
    const uint32_t r = static_cast<uint32_t>(rng());
    const uint32_t biased = static_cast<uint32_t>(exp(rng) + 127);
    x = float_of((r & 0x807FFFFFu) | (biased << 23));
  }
  return out;
}

// Exact midpoints between neighbouring 16-bit values (ties), and the floats one ulp either
// side of them, for random positive patterns below `inf` and both signs.
std::vector<float> random_ties(size_t n, uint16_t inf, float (*to_float)(uint16_t), uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> pattern(0, inf - 1u);
  std::vector<float> out;
  out.reserve(3 * n);
  for (size_t i = 0; i < n; ++i) {
    const uint16_t b = static_cast<uint16_t>(pattern(rng));
    const double lo = to_float(b);
    // The next value up; for the largest finite value that is the would-be next power of two.
    const double hi = b + 1u == inf ? 2.0 * std::ldexp(1.0, std::ilogb(lo)) : to_float(b + 1);
    const float mid = static_cast<float>((lo + hi) / 2);  // exact: 16-bit formats are narrower
    const float sign = (rng() & 1u) ? -1.0f : 1.0f;
    out.push_back(sign * mid);
    out.push_back(sign * std::nextafter(mid, 0.0f));
    out.push_back(sign * std::nextafter(mid, INFINITY));
  }
  return out;
}

std::vector<float> concat(std::initializer_list<std::vector<float>> parts) {
  std::vector<float> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

#if MIXPREC_TEST_X86
// Sets MXCSR for a scope: the conversions must not depend on its rounding mode or FTZ/DAZ.
class MxcsrGuard {
 public:
  explicit MxcsrGuard(unsigned value) : saved_(_mm_getcsr()) { _mm_setcsr(value); }
  ~MxcsrGuard() { _mm_setcsr(saved_); }
  MxcsrGuard(const MxcsrGuard&) = delete;
  MxcsrGuard& operator=(const MxcsrGuard&) = delete;

 private:
  unsigned saved_;
};
#endif

}  // namespace

// --- Exhaustive 16-bit sweeps --------------------------------------------------------------

TEST_CASE("every FP16 pattern converts to the right float and back", "[dtype]") {
  Mismatches value, round_trip, hardware;
  const bool has_f16c = cpu_has("f16c");
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    const float f = half_bits_to_float(h);
    const uint16_t back = float_to_half_bits(f);
    const bool nan = (h & 0x7C00) == 0x7C00 && (h & 0x03FF) != 0;
    if (nan) {
      // NaN stays NaN with its sign; the payload survives and the quiet bit is set.
      const uint32_t expect = (static_cast<uint32_t>(h & 0x8000) << 16) | 0x7FC00000u |
                              (static_cast<uint32_t>(h & 0x03FF) << 13);
      if (bits32(f) != expect) value.add(hex(h) + " -> " + hex(bits32(f)));
      if (back != (h | 0x0200)) round_trip.add(hex(h) + " -> " + hex(back));
    } else {
      const double magnitude = half_value_ref(h & 0x7FFF);
      const double expect = (h & 0x7C00) == 0x7C00 ? INFINITY : magnitude;
      const float signed_expect = static_cast<float>((h & 0x8000) ? -expect : expect);
      if (bits32(f) != bits32(signed_expect)) value.add(hex(h) + " -> " + hex(bits32(f)));
      if (back != h) round_trip.add(hex(h) + " -> " + hex(back));
    }
    if (has_f16c && bits32(f) != bits32(hw_half_to_float(h))) {
      hardware.add(hex(h) + " -> " + hex(bits32(f)));
    }
  }
  INFO("wrong values:\n" << value.examples);
  CHECK(value.count == 0);
  INFO("round-trip failures:\n" << round_trip.examples);
  CHECK(round_trip.count == 0);
  INFO("differences from vcvtph2ps:\n" << hardware.examples);
  CHECK(hardware.count == 0);
}

TEST_CASE("every BF16 pattern converts to the right float and back", "[dtype]") {
  Mismatches value, round_trip;
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    const float f = bf16_bits_to_float(h);
    const uint16_t back = float_to_bf16_bits(f);
    const bool nan = (h & 0x7F80) == 0x7F80 && (h & 0x007F) != 0;
    if (nan) {
      // Widening is a plain shift, so even a signaling NaN keeps every bit.
      if (bits32(f) != static_cast<uint32_t>(h) << 16)
        value.add(hex(h) + " -> " + hex(bits32(f)));
      if (back != (h | 0x0040)) round_trip.add(hex(h) + " -> " + hex(back));
    } else {
      const double magnitude = bf16_value_ref(h & 0x7FFF);
      const double expect = (h & 0x7F80) == 0x7F80 ? INFINITY : magnitude;
      const float signed_expect = static_cast<float>((h & 0x8000) ? -expect : expect);
      if (bits32(f) != bits32(signed_expect)) value.add(hex(h) + " -> " + hex(bits32(f)));
      if (back != h) round_trip.add(hex(h) + " -> " + hex(back));
    }
  }
  INFO("wrong values:\n" << value.examples);
  CHECK(value.count == 0);
  INFO("round-trip failures:\n" << round_trip.examples);
  CHECK(round_trip.count == 0);
}

// --- float -> 16 bit against references ----------------------------------------------------

TEST_CASE("float to FP16 matches F16C and the double reference", "[dtype]") {
  const std::vector<float> inputs =
      concat({random_patterns(1'000'000, kSeed), random_in_exponents(1'000'000, -30, 20, kSeed + 1),
              random_ties(300'000, 0x7C00, half_bits_to_float, kSeed + 2)});
  const bool has_f16c = cpu_has("f16c");
  if (!has_f16c) WARN("this CPU has no F16C: skipping the hardware comparison for FP16");
  Mismatches hardware, reference;
  for (float x : inputs) {
    const uint16_t got = float_to_half_bits(x);
    if (has_f16c && got != hw_float_to_half(x)) {
      hardware.add(hex(bits32(x)) + " -> " + hex(got) + ", F16C " + hex(hw_float_to_half(x)));
    }
    if (got != half_ref(x)) {
      reference.add(hex(bits32(x)) + " -> " + hex(got) + ", reference " + hex(half_ref(x)));
    }
  }
  INFO(inputs.size() << " inputs; differences from vcvtps2ph:\n" << hardware.examples);
  CHECK(hardware.count == 0);
  INFO("differences from the double reference:\n" << reference.examples);
  CHECK(reference.count == 0);
}

TEST_CASE("float to BF16 matches the double reference and vcvtneps2bf16", "[dtype]") {
  // Float subnormals are 1/256 of random patterns; the exponent sweep and the explicit
  // subnormal patterns exercise the rounding of BF16 subnormals densely.
  std::vector<float> subnormals = random_patterns(200'000, kSeed + 3);
  for (auto& x : subnormals) x = float_of(bits32(x) & 0x807FFFFFu);
  std::vector<float> inputs = concat({random_patterns(1'000'000, kSeed + 4),
                                      random_in_exponents(500'000, -126, -100, kSeed + 5),
                                      random_in_exponents(500'000, 100, 127, kSeed + 6), subnormals,
                                      random_ties(300'000, 0x7F80, bf16_bits_to_float, kSeed + 7)});
  inputs.resize(inputs.size() / 16 * 16);  // the hardware reference converts 16 at a time

  Mismatches reference;
  for (float x : inputs) {
    const uint16_t got = float_to_bf16_bits(x);
    if (got != bf16_ref(x)) {
      reference.add(hex(bits32(x)) + " -> " + hex(got) + ", reference " + hex(bf16_ref(x)));
    }
  }
  INFO(inputs.size() << " inputs; differences from the double reference:\n" << reference.examples);
  CHECK(reference.count == 0);

  if (!cpu_has("avx512bf16")) {
    WARN("this CPU has no AVX512-BF16: skipping the hardware comparison for BF16");
    return;
  }
  Mismatches hardware;
  size_t compared = 0;
  uint16_t hw[16];
  for (size_t i = 0; i < inputs.size(); i += 16) {
    hw_float_to_bf16_16(&inputs[i], hw);
    for (size_t j = 0; j < 16; ++j) {
      const uint32_t u = bits32(inputs[i + j]);
      if ((u & 0x7F800000u) == 0) continue;  // the instruction flushes subnormals and zeros
      ++compared;
      const uint16_t got = float_to_bf16_bits(inputs[i + j]);
      if (got != hw[j]) hardware.add(hex(u) + " -> " + hex(got) + ", hardware " + hex(hw[j]));
    }
  }
  INFO(compared << " normal inputs; differences from vcvtneps2bf16:\n" << hardware.examples);
  CHECK(compared > 1'000'000);
  CHECK(hardware.count == 0);
}

// --- Known values --------------------------------------------------------------------------

TEST_CASE("FP16 known values", "[dtype]") {
  CHECK(float_to_half_bits(1e-8f) == 0x0000);
  CHECK(static_cast<double>(half_bits_to_float(float_to_half_bits(0.00016384f))) ==
        0.00016379356384277344);
  CHECK(float_to_half_bits(1.0f) == 0x3C00);
  CHECK(float_to_half_bits(-2.0f) == 0xC000);
  CHECK(float_to_half_bits(65504.0f) == 0x7BFF);
  CHECK(half_bits_to_float(0x7BFF) == 65504.0f);
  CHECK(float_to_half_bits(65519.0f) == 0x7BFF);
  CHECK(float_to_half_bits(std::nextafter(65520.0f, 0.0f)) == 0x7BFF);
  CHECK(float_to_half_bits(65520.0f) == 0x7C00);
  CHECK(float_to_half_bits(-65520.0f) == 0xFC00);
  CHECK(float_to_half_bits(1e30f) == 0x7C00);
  CHECK(float_to_half_bits(0x1p-14f) == 0x0400);
  CHECK(half_bits_to_float(0x0400) == 0x1p-14f);
  CHECK(float_to_half_bits(0x1p-24f) == 0x0001);
  CHECK(half_bits_to_float(0x0001) == 0x1p-24f);
  CHECK(half_bits_to_float(0x03FF) == 1023 * 0x1p-24f);
  CHECK(float_to_half_bits(0x1p-25f) == 0x0000);  // tie between 0 and 2^-24: even
  CHECK(float_to_half_bits(-0x1p-25f) == 0x8000);
  CHECK(float_to_half_bits(1.5f * 0x1p-25f) == 0x0001);
  CHECK(float_to_half_bits(std::nextafter(0x1p-25f, 1.0f)) == 0x0001);
  CHECK(float_to_half_bits(3 * 0x1p-25f) == 0x0002);  // tie between 1 and 2 ulps: even
  CHECK(float_to_half_bits(5 * 0x1p-25f) == 0x0002);  // tie between 2 and 3 ulps: even
  CHECK(float_to_half_bits(std::nextafter(0x1p-14f, 0.0f)) == 0x0400);  // rounds up a binade
  CHECK(float_to_half_bits(1.0f + 0x1p-11f) == 0x3C00);                 // tie: even
  CHECK(float_to_half_bits(1.0f + 3 * 0x1p-11f) == 0x3C02);             // tie: even
  CHECK(float_to_half_bits(0.0f) == 0x0000);
  CHECK(float_to_half_bits(-0.0f) == 0x8000);
  CHECK(std::signbit(half_bits_to_float(0x8000)));
  CHECK(half_bits_to_float(0x8000) == 0.0f);
  CHECK(float_to_half_bits(INFINITY) == 0x7C00);
  CHECK(float_to_half_bits(-INFINITY) == 0xFC00);
  CHECK(half_bits_to_float(0x7C00) == INFINITY);
  CHECK(half_bits_to_float(0xFC00) == -INFINITY);
  CHECK(float_to_half_bits(float_of(0x00000001)) == 0x0000);  // float subnormal
  CHECK(float_to_half_bits(float_of(0x80000001)) == 0x8000);

  const uint16_t qnan = float_to_half_bits(std::nanf(""));
  CHECK((qnan & 0x7C00) == 0x7C00);
  CHECK((qnan & 0x0200) != 0);
  CHECK(std::isnan(half_bits_to_float(qnan)));
  CHECK(float_to_half_bits(-std::nanf("")) == 0xFE00);
  // A signaling NaN whose payload lies below the kept bits must not turn into infinity.
  CHECK(float_to_half_bits(float_of(0x7F800001)) == 0x7E00);
  CHECK(float_to_half_bits(float_of(0x7F802000)) == 0x7E01);
  CHECK(bits32(half_bits_to_float(0x7C01)) == 0x7FC02000);
  CHECK(bits32(half_bits_to_float(0xFE00)) == 0xFFC00000);
}

TEST_CASE("BF16 known values", "[dtype]") {
  CHECK(float_to_bf16_bits(1.0f) == 0x3F80);
  CHECK(float_to_bf16_bits(-1.0f) == 0xBF80);
  CHECK(bf16_bits_to_float(0x3F80) == 1.0f);
  CHECK(bf16_bits_to_float(0x7F7F) == 0x1.FEp127f);
  CHECK(bf16_bits_to_float(0x7F7F) == Approx(3.3895314e38f).epsilon(1e-7));
  CHECK(float_to_bf16_bits(0x1.FEp127f) == 0x7F7F);
  CHECK(float_to_bf16_bits(float_of(0x7F7F7FFF)) == 0x7F7F);  // just below the midpoint
  CHECK(float_to_bf16_bits(float_of(0x7F7F8000)) == 0x7F80);  // the midpoint: ties to even
  CHECK(float_to_bf16_bits(float_of(0x7F7FFFFF)) == 0x7F80);  // FLT_MAX
  CHECK(float_to_bf16_bits(-float_of(0x7F7FFFFF)) == 0xFF80);
  CHECK(float_to_bf16_bits(0x1p-126f) == 0x0080);
  CHECK(float_to_bf16_bits(0x1p-133f) == 0x0001);
  CHECK(bf16_bits_to_float(0x0001) == 0x1p-133f);
  CHECK(float_to_bf16_bits(0x1p-134f) == 0x0000);      // tie: even
  CHECK(float_to_bf16_bits(3 * 0x1p-134f) == 0x0002);  // tie: even
  CHECK(float_to_bf16_bits(std::nextafter(0x1p-134f, 1.0f)) == 0x0001);
  CHECK(float_to_bf16_bits(std::nextafter(0x1p-126f, 0.0f)) == 0x0080);  // rounds up a binade
  CHECK(float_to_bf16_bits(float_of(0x00000001)) == 0x0000);             // float subnormal
  CHECK(float_to_bf16_bits(1.0f + 0x1p-8f) == 0x3F80);                   // tie: even
  CHECK(float_to_bf16_bits(1.0f + 3 * 0x1p-8f) == float_to_bf16_bits(1.0f + 0x1p-6f));
  CHECK(bf16_bits_to_float(float_to_bf16_bits(1.0f + 3 * 0x1p-8f)) == 1.0f + 0x1p-6f);
  CHECK(float_to_bf16_bits(std::nextafter(1.0f + 0x1p-8f, 2.0f)) == 0x3F81);
  CHECK(float_to_bf16_bits(0.0f) == 0x0000);
  CHECK(float_to_bf16_bits(-0.0f) == 0x8000);
  CHECK(float_to_bf16_bits(INFINITY) == 0x7F80);
  CHECK(float_to_bf16_bits(-INFINITY) == 0xFF80);
  CHECK(bf16_bits_to_float(0xFF80) == -INFINITY);
  CHECK(float_to_bf16_bits(std::nanf("")) == 0x7FC0);
  CHECK(float_to_bf16_bits(-std::nanf("")) == 0xFFC0);
  // Truncating 0x7F800001 would give the infinity pattern; the quiet bit keeps it a NaN.
  CHECK(float_to_bf16_bits(float_of(0x7F800001)) == 0x7FC0);
  CHECK(float_to_bf16_bits(float_of(0xFFA50000)) == 0xFFE5);
  CHECK(std::isnan(bf16_bits_to_float(0x7F81)));
}

TEST_CASE("half and bfloat16 types and helpers", "[dtype]") {
  STATIC_REQUIRE(sizeof(half) == 2);
  STATIC_REQUIRE(sizeof(bfloat16) == 2);
  STATIC_REQUIRE(std::is_trivially_copyable_v<half>);
  STATIC_REQUIRE(std::is_trivially_copyable_v<bfloat16>);
  STATIC_REQUIRE(std::is_trivially_default_constructible_v<half>);
  STATIC_REQUIRE(!std::is_convertible_v<float, half>);  // rounding must be spelled out
  STATIC_REQUIRE(!std::is_convertible_v<float, bfloat16>);

  const half h(0.1f);
  CHECK(h.bits == 0x2E66);
  CHECK(static_cast<float>(h) == half_bits_to_float(0x2E66));
  CHECK(half::from_bits(0x3C00).bits == 0x3C00);
  CHECK(static_cast<float>(half::from_bits(0x3C00)) == 1.0f);
  const bfloat16 b(0.1f);
  CHECK(b.bits == 0x3DCD);
  CHECK(static_cast<float>(bfloat16::from_bits(0x3F80)) == 1.0f);

  CHECK(mixprec::to_float(2.5f) == 2.5f);
  CHECK(mixprec::to_float(half(2.5f)) == 2.5f);
  CHECK(mixprec::to_float(bfloat16(2.5f)) == 2.5f);
  CHECK(mixprec::from_float<float>(0.1f) == 0.1f);
  CHECK(mixprec::from_float<half>(0.1f).bits == 0x2E66);
  CHECK(mixprec::from_float<bfloat16>(0.1f).bits == 0x3DCD);

  CHECK(half::from_bits(0x7BFF) == mixprec::kHalfMax);
  CHECK(half::from_bits(0x0400) == mixprec::kHalfMinNormal);
  CHECK(half::from_bits(0x0001) == mixprec::kHalfMinSubnormal);
  CHECK(bfloat16::from_bits(0x7F7F) == mixprec::kBf16Max);
  CHECK(bfloat16::from_bits(0x0080) == mixprec::kBf16MinNormal);
  CHECK(bfloat16::from_bits(0x0001) == mixprec::kBf16MinSubnormal);
  CHECK(mixprec::kHalfMinNormal == std::ldexp(1.0f, -14));
  CHECK(mixprec::kHalfMinSubnormal == std::ldexp(1.0f, -24));
  CHECK(mixprec::kBf16MinNormal == std::ldexp(1.0f, -126));
  CHECK(mixprec::kBf16MinSubnormal == std::ldexp(1.0f, -133));
}

// --- Bulk conversions ----------------------------------------------------------------------

namespace {

// One way of running a bulk conversion; returns false when this CPU cannot run it.
template <class Src, class Dst>
using BulkPath = std::function<bool(const Src*, Dst*, size_t)>;

template <class Src, class Dst>
struct NamedPath {
  std::string name;
  BulkPath<Src, Dst> run;
};

// Runs `path` on src[offset, offset + n) and compares with the scalar reference bit for bit,
// including that nothing past dst[n - 1] is written.
template <class Src, class Dst>
void compare_with_scalar(const std::vector<Src>& src, size_t offset, size_t n,
                         void (*scalar)(const Src*, Dst*, size_t),
                         const NamedPath<Src, Dst>& path) {
  std::vector<Dst> expect(n + 1), got(n + 1);
  scalar(src.data() + offset, expect.data(), n);
  std::memset(&got[n], 0xA5, sizeof(Dst));
  Dst sentinel;
  std::memcpy(&sentinel, &got[n], sizeof(Dst));
  if (!path.run(src.data() + offset, got.data(), n)) {
    WARN(path.name << " is not available on this CPU");
    return;
  }
  size_t first_diff = n;
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(&expect[i], &got[i], sizeof(Dst)) != 0) {
      first_diff = i;
      break;
    }
  }
  INFO(path.name << ", n = " << n << ", offset = " << offset << ", first difference at "
                 << first_diff);
  CHECK(first_diff == n);
  CHECK(std::memcmp(&got[n], &sentinel, sizeof(Dst)) == 0);
}

template <class Src, class Dst>
void compare_all_lengths(const std::vector<Src>& src, void (*scalar)(const Src*, Dst*, size_t),
                         const std::vector<NamedPath<Src, Dst>>& paths) {
  for (const auto& path : paths) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{15}, size_t{16}, size_t{17},
                     size_t{31}, size_t{33}, size_t{1000}, size_t{1000003}}) {
      // Offset 1 makes every vector load and store unaligned.
      compare_with_scalar(src, 0, n, scalar, path);
      compare_with_scalar(src, 1, n, scalar, path);
    }
  }
}

// The public function, the best vector path, and each instruction set on its own.
template <class Src, class Dst>
std::vector<NamedPath<Src, Dst>> paths_for(void (*pub)(const Src*, Dst*, size_t),
                                           bool (*best)(const Src*, Dst*, size_t),
                                           bool (*by_isa)(mixprec::detail::VectorIsa, const Src*,
                                                          Dst*, size_t)) {
  using mixprec::detail::VectorIsa;
  return {
      {"public",
       [pub](const Src* s, Dst* d, size_t n) {
         pub(s, d, n);
         return true;
       }},
      {"vector", best},
      {"avx2",
       [by_isa](const Src* s, Dst* d, size_t n) { return by_isa(VectorIsa::kAvx2, s, d, n); }},
      {"avx512",
       [by_isa](const Src* s, Dst* d, size_t n) { return by_isa(VectorIsa::kAvx512, s, d, n); }},
  };
}

std::vector<uint16_t> random_halves(uint32_t seed) {
  // All 65,536 patterns first, then random ones up to 10^6 + 1 elements.
  std::vector<uint16_t> out(1'000'004);
  std::mt19937 rng(seed);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<uint16_t>(i <= 0xFFFF ? i : rng());
  }
  return out;
}

// Floats that stress every branch: random patterns, then the FP16 range, then ties.
std::vector<float> bulk_floats(uint32_t seed) {
  std::vector<float> out =
      concat({random_patterns(700'000, seed), random_in_exponents(200'000, -30, 20, seed + 1),
              random_ties(35'000, 0x7C00, half_bits_to_float, seed + 2),
              random_ties(35'000, 0x7F80, bf16_bits_to_float, seed + 3)});
  out.resize(1'000'004, 1.0f);
  return out;
}

}  // namespace

TEST_CASE("bulk conversions: vector paths give the scalar bits", "[dtype]") {
  namespace d = mixprec::detail;
  const std::vector<float> floats = bulk_floats(kSeed + 10);
  const std::vector<uint16_t> halves = random_halves(kSeed + 11);

  INFO("AVX2+F16C: " << d::vector_isa_supported(d::VectorIsa::kAvx2)
                     << ", AVX-512: " << d::vector_isa_supported(d::VectorIsa::kAvx512));
  SECTION("f32 -> f16") {
    compare_all_lengths<float, uint16_t>(
        floats, d::convert_f32_to_f16_scalar,
        paths_for<float, uint16_t>(mixprec::convert_f32_to_f16, d::convert_f32_to_f16_vector,
                                   d::convert_f32_to_f16_vector));
  }
  SECTION("f16 -> f32") {
    compare_all_lengths<uint16_t, float>(
        halves, d::convert_f16_to_f32_scalar,
        paths_for<uint16_t, float>(mixprec::convert_f16_to_f32, d::convert_f16_to_f32_vector,
                                   d::convert_f16_to_f32_vector));
  }
  SECTION("f32 -> bf16") {
    compare_all_lengths<float, uint16_t>(
        floats, d::convert_f32_to_bf16_scalar,
        paths_for<float, uint16_t>(mixprec::convert_f32_to_bf16, d::convert_f32_to_bf16_vector,
                                   d::convert_f32_to_bf16_vector));
  }
  SECTION("bf16 -> f32") {
    compare_all_lengths<uint16_t, float>(
        halves, d::convert_bf16_to_f32_scalar,
        paths_for<uint16_t, float>(mixprec::convert_bf16_to_f32, d::convert_bf16_to_f32_vector,
                                   d::convert_bf16_to_f32_vector));
  }
}

#if MIXPREC_TEST_X86
namespace {

// Runs every path of one conversion under several MXCSR settings and compares with the
// scalar path under the default setting.
template <class Src, class Dst>
void check_mxcsr_independent(const std::vector<Src>& src, void (*scalar)(const Src*, Dst*, size_t),
                             std::vector<NamedPath<Src, Dst>> paths) {
  const size_t n = src.size();
  std::vector<Dst> expect(n);
  {
    MxcsrGuard guard(0x1F80);  // the power-on default: round to nearest, no FTZ/DAZ
    scalar(src.data(), expect.data(), n);
  }
  paths.push_back({"scalar", [scalar](const Src* s, Dst* d, size_t k) {
                     scalar(s, d, k);
                     return true;
                   }});
  // FTZ | DAZ; round down; round up; round toward zero; all of them at once.
  for (unsigned csr : {0x9FC0u, 0x3F80u, 0x5F80u, 0x7F80u, 0xFFC0u}) {
    for (const auto& path : paths) {
      std::vector<Dst> got(n);
      bool ran;
      {
        MxcsrGuard guard(csr);
        ran = path.run(src.data(), got.data(), n);
      }
      if (!ran) continue;
      INFO(path.name << " with MXCSR = " << hex(csr));
      CHECK(std::memcmp(got.data(), expect.data(), n * sizeof(Dst)) == 0);
    }
  }
}

}  // namespace
#endif

TEST_CASE("bulk conversions ignore the MXCSR rounding mode and FTZ/DAZ", "[dtype]") {
#if MIXPREC_TEST_X86
  namespace d = mixprec::detail;
  // Subnormal-heavy inputs, which FTZ/DAZ would flush if an instruction honoured MXCSR, and
  // inexact ones, which a directed rounding mode would round differently.
  std::vector<float> float_subnormals = random_patterns(100'000, kSeed + 20);
  for (auto& x : float_subnormals) x = float_of(bits32(x) & 0x807FFFFFu);
  const std::vector<float> floats =
      concat({float_subnormals, random_in_exponents(100'000, -126, -110, kSeed + 21),
              random_in_exponents(100'000, -30, 20, kSeed + 22),
              random_ties(20'000, 0x7C00, half_bits_to_float, kSeed + 23),
              random_ties(20'000, 0x7F80, bf16_bits_to_float, kSeed + 24)});
  const std::vector<uint16_t> halves = random_halves(kSeed + 25);

  check_mxcsr_independent<float, uint16_t>(
      floats, d::convert_f32_to_f16_scalar,
      paths_for<float, uint16_t>(mixprec::convert_f32_to_f16, d::convert_f32_to_f16_vector,
                                 d::convert_f32_to_f16_vector));
  check_mxcsr_independent<uint16_t, float>(
      halves, d::convert_f16_to_f32_scalar,
      paths_for<uint16_t, float>(mixprec::convert_f16_to_f32, d::convert_f16_to_f32_vector,
                                 d::convert_f16_to_f32_vector));
  check_mxcsr_independent<float, uint16_t>(
      floats, d::convert_f32_to_bf16_scalar,
      paths_for<float, uint16_t>(mixprec::convert_f32_to_bf16, d::convert_f32_to_bf16_vector,
                                 d::convert_f32_to_bf16_vector));
  check_mxcsr_independent<uint16_t, float>(
      halves, d::convert_bf16_to_f32_scalar,
      paths_for<uint16_t, float>(mixprec::convert_bf16_to_f32, d::convert_bf16_to_f32_vector,
                                 d::convert_bf16_to_f32_vector));
#else
  WARN("not an x86 CPU: no MXCSR to vary");
#endif
}
