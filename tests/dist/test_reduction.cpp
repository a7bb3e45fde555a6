// The collectives' arithmetic in one process: shards, the rank-ordered sum, the NaN-winning max.
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "dist/reduction.h"

using namespace mixprec::dist;

namespace {
uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }
}  // namespace

TEST_CASE("shard_of: contiguous shards in order that cover the buffer, sizes within one",
          "[dist]") {
  for (int64_t numel : {0, 1, 2, 3, 5, 7, 1000, 4099}) {
    for (int parts = 1; parts <= 5; ++parts) {
      int64_t next = 0;
      for (int r = 0; r < parts; ++r) {
        const Shard s = shard_of(numel, parts, r);
        CHECK(s.begin == next);
        CHECK(s.size >= numel / parts);
        CHECK(s.size <= numel / parts + 1);
        next = s.begin + s.size;
      }
      CHECK(next == numel);
    }
  }
}

TEST_CASE("add_in_rank_order: from +0, rank 0 first, each addition rounded to FP32", "[dist]") {
  const float inf = std::numeric_limits<float>::infinity();
  const float tiny = std::numeric_limits<float>::denorm_min();
  // Three runs of six; per element the ranks' values are (a, b, c).
  const std::vector<float> runs = {
      1.0f,  1e8f,  -0.0f, tiny,  3e38f,  inf,   // rank 0
      1e8f,  1.0f,  -0.0f, tiny,  3e38f,  -inf,  // rank 1
      -1e8f, -1e8f, -0.0f, -tiny, -3e38f, 1.0f   // rank 2
  };
  std::vector<float> out(6);
  add_in_rank_order(runs.data(), 3, 6, out.data());
  CHECK(out[0] == 0.0f);  // (1 + 1e8) rounds to 1e8; another order would give 1
  CHECK(out[1] == 0.0f);
  CHECK(bits(out[2]) == bits(0.0f));  // +0 + -0 + -0 + -0 is +0
  CHECK(out[3] == tiny);              // subnormals add exactly
  CHECK(out[4] == inf);               // 3e38 + 3e38 overflows before -3e38 comes
  CHECK(std::isnan(out[5]));          // inf + -inf
  // The first element in reverse order is 1: the order above is what made it 0.
  CHECK((((0.0f + -1e8f) + 1e8f) + 1.0f) == 1.0f);
}

TEST_CASE("max_nan_wins: NaN above everything, +0 above -0, same bits in either order", "[dist]") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float negative_nan = -nan;
  const std::vector<float> values = {-inf, -1.0f, -0.0f, 0.0f,        1e-45f,
                                     2.0f, inf,   nan,   negative_nan};
  for (float a : values) {
    for (float b : values) {
      const float ab = max_nan_wins(a, b);
      CHECK(bits(ab) == bits(max_nan_wins(b, a)));
      if (std::isnan(a) || std::isnan(b)) {
        CHECK(bits(ab) == bits(nan));
      } else if (a == 0.0f && b == 0.0f) {
        CHECK(bits(ab) == bits(std::signbit(a) && std::signbit(b) ? -0.0f : 0.0f));
      } else {
        CHECK(ab == std::max(a, b));
      }
    }
  }
}
