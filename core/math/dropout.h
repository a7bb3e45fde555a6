// Per-element math of dropout, shared by the CPU and CUDA backends. Element i of a call
// keyed (seed, offset) has the counter c = offset + i and draws word c % 4 of the Philox block
// c / 4: one Philox evaluation gives the draws of four consecutive counters, and a
// (seed, offset) key still fixes the mask on every backend and for any thread count; the
// backward replays the same key. Distinct counters never share a word, so calls whose
// counter ranges do not overlap draw independent masks, whatever their alignment.
#pragma once

#include <cstdint>

#include "core/hd.h"
#include "core/philox.h"

namespace mixprec {

// True when a draw of `word` keeps its element (probability 1 - p): its top 24 bits, read as
// a uniform number in [0, 1), are at least p.
MIXPREC_HD bool dropout_keep_word(uint32_t word, float p) {
  return !(static_cast<float>(word >> 8) * (1.0f / 16777216.0f) < p);
}

// True when the element of counter `counter` survives: one Philox evaluation, for code that
// visits counters one at a time. Loops over consecutive counters use DropoutDraws or
// fill_dropout_keep, which evaluate Philox once per block of four.
MIXPREC_HD bool dropout_keep(uint64_t seed, uint64_t counter, float p) {
  return dropout_keep_word(philox4x32(seed, counter >> 2).v[counter & 3u], p);
}

// The last Philox block a thread evaluated: asking for counters in increasing order (or any
// order that stays within a block for four asks) costs one evaluation per block.
struct DropoutDraws {
  uint64_t block = ~uint64_t{0};
  Philox4 words{};
  MIXPREC_HD bool keep(uint64_t seed, uint64_t counter, float p) {
    if ((counter >> 2) != block) {
      block = counter >> 2;
      words = philox4x32(seed, block);
    }
    return dropout_keep_word(words.v[counter & 3u], p);
  }
};

// keep[i] = dropout_keep(seed, first + i, p) for i < n, one Philox evaluation per block of
// four; the loop over whole blocks has no branches, so a host compiler vectorises it.
MIXPREC_HD void fill_dropout_keep(uint64_t seed, uint64_t first, int64_t n, float p,
                                  uint8_t* keep) {
  int64_t i = 0;
  // Up to the first counter that starts a block.
  for (; i < n && ((first + static_cast<uint64_t>(i)) & 3u) != 0; ++i) {
    keep[i] = dropout_keep(seed, first + static_cast<uint64_t>(i), p);
  }
  const uint64_t block0 = (first + static_cast<uint64_t>(i)) >> 2;
  const int64_t blocks = (n - i) / 4;
  uint8_t* out = keep + i;
  for (int64_t b = 0; b < blocks; ++b) {
    const Philox4 r = philox4x32(seed, block0 + static_cast<uint64_t>(b));
    out[4 * b] = dropout_keep_word(r.v[0], p);
    out[4 * b + 1] = dropout_keep_word(r.v[1], p);
    out[4 * b + 2] = dropout_keep_word(r.v[2], p);
    out[4 * b + 3] = dropout_keep_word(r.v[3], p);
  }
  for (i += 4 * blocks; i < n; ++i) keep[i] = dropout_keep(seed, first + static_cast<uint64_t>(i), p);
}

// 1 / (1 - p), for p in [0, 1): survivors are scaled so that the expected value is unchanged.
MIXPREC_HD float dropout_scale(float p) { return 1.0f / (1.0f - p); }

// x * scale for a kept element, 0 for a dropped one; scale = dropout_scale(p). The product is
// rounded on its own: a fused kernel that goes on to subtract from it (attention's softmax
// backward) must get the bits of the separate dropout, which stores the product first, so on
// the device the compiler is told not to fuse it into a multiply-add. (The host compiler
// cannot fuse across the select; the CPU tests of the fused ops hold it to that.)
MIXPREC_HD float dropout_value(float x, bool keep, float scale) {
#if defined(__CUDA_ARCH__)
  return keep ? __fmul_rn(x, scale) : 0.0f;
#else
  return keep ? x * scale : 0.0f;
#endif
}

}  // namespace mixprec
