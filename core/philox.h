// Philox4x32-10 counter-based random numbers (Salmon et al., SC'11). A value depends only on
// (seed, counter), so every backend and every thread count draws the same numbers for the
// same element.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/hd.h"

namespace mixprec {

// Seed and counter offset of a random fill or dropout mask. A call of n elements reserves the
// counters [offset, offset + n): a fill's element i draws from counter offset + i, dropout's
// from a word of counter offset + i / 4 (core/math/dropout.h), so every backend produces the
// same numbers.
//
// `base`, for dropout masks on the CUDA backend only: when set, the offset is *base + offset,
// with *base read in device memory when the kernel runs. The backend sets it while a training
// step is recorded as a CUDA graph (core/step_graphs.h), so that each replay draws the masks
// of its own step rather than those of the recorded one. Null everywhere else.
struct PhiloxKey {
  uint64_t seed = 0;
  uint64_t offset = 0;
  const uint64_t* base = nullptr;
};

struct Philox4 {
  uint32_t v[4];
};

MIXPREC_HD uint32_t philox_mulhilo(uint32_t a, uint32_t b, uint32_t* hi) {
  const uint64_t product = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(product >> 32);
  return static_cast<uint32_t>(product);
}

// Four 32-bit random words for `counter` under `seed`.
MIXPREC_HD Philox4 philox4x32(uint64_t seed, uint64_t counter) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, hi1;
    const uint32_t lo0 = philox_mulhilo(0xD2511F53u, c0, &hi0);
    const uint32_t lo1 = philox_mulhilo(0xCD9E8D57u, c2, &hi1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// Uniform in [0, 1) with 24 random bits (every value exactly representable in float).
MIXPREC_HD float philox_uniform(uint64_t seed, uint64_t counter) {
  return static_cast<float>(philox4x32(seed, counter).v[0] >> 8) * (1.0f / 16777216.0f);
}

// Standard normal by Box-Muller from two words of the same counter.
MIXPREC_HD float philox_normal(uint64_t seed, uint64_t counter) {
  const Philox4 r = philox4x32(seed, counter);
  const float u1 = (static_cast<float>(r.v[1] >> 8) + 1.0f) * (1.0f / 16777216.0f);  // (0, 1]
  const float u2 = static_cast<float>(r.v[2] >> 8) * (1.0f / 16777216.0f);
  return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647692f * u2);
}

}  // namespace mixprec
