// Per-element math of dropout, shared by the CPU and CUDA backends. Element i of a call keyed
// (seed, offset) draws word i % 4 of the Philox block at counter offset + i / 4: one Philox
// evaluation gives the draws of four consecutive elements, and the key fixes the mask on
// every backend and for any thread count; the backward replays the same key. A call of n
// elements reserves the counters [offset, offset + n) of its Generator and evaluates only
// blocks inside them (the first ceil(n / 4)), so no two calls of a Generator, random fills
// included, share a block: their draws are independent.
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

// The Philox block of element `index` of a call keyed `key` (its device base added when set:
// core/philox.h).
MIXPREC_HD uint64_t dropout_block(const PhiloxKey& key, uint64_t index) {
  const uint64_t offset = key.base == nullptr ? key.offset : *key.base + key.offset;
  return offset + (index >> 2);
}

// True when element `index` of a call keyed `key` survives: one Philox evaluation, for code
// that visits elements one at a time. Loops over consecutive elements use DropoutDraws or
// fill_dropout_keep, which evaluate Philox once per block of four.
MIXPREC_HD bool dropout_keep(const PhiloxKey& key, uint64_t index, float p) {
  return dropout_keep_word(philox4x32(key.seed, dropout_block(key, index)).v[index & 3u], p);
}

// The last Philox block a thread evaluated: asking for elements in increasing order (or any
// order that stays within a block for four asks) costs one evaluation per block.
struct DropoutDraws {
  uint64_t block = ~uint64_t{0};
  Philox4 words{};
  MIXPREC_HD bool keep(const PhiloxKey& key, uint64_t index, float p) {
    const uint64_t wanted = dropout_block(key, index);
    if (wanted != block) {
      block = wanted;
      words = philox4x32(key.seed, block);
    }
    return dropout_keep_word(words.v[index & 3u], p);
  }
};

// keep[i] = dropout_keep(key, first + i, p) for i < n: one Philox evaluation per block of
// four, the elements before the first block boundary and after the last one through a
// DropoutDraws. The loop over whole blocks has no branches, so a host compiler vectorises it.
MIXPREC_HD void fill_dropout_keep(const PhiloxKey& key, uint64_t first, int64_t n, float p,
                                  uint8_t* keep) {
  DropoutDraws edge;
  int64_t i = 0;
  for (; i < n && ((first + static_cast<uint64_t>(i)) & 3u) != 0; ++i) {
    keep[i] = edge.keep(key, first + static_cast<uint64_t>(i), p);
  }
  const uint64_t block0 = dropout_block(key, first + static_cast<uint64_t>(i));
  const int64_t blocks = (n - i) / 4;
  uint8_t* out = keep + i;
  for (int64_t b = 0; b < blocks; ++b) {
    const Philox4 r = philox4x32(key.seed, block0 + static_cast<uint64_t>(b));
    out[4 * b] = dropout_keep_word(r.v[0], p);
    out[4 * b + 1] = dropout_keep_word(r.v[1], p);
    out[4 * b + 2] = dropout_keep_word(r.v[2], p);
    out[4 * b + 3] = dropout_keep_word(r.v[3], p);
  }
  for (i += 4 * blocks; i < n; ++i) keep[i] = edge.keep(key, first + static_cast<uint64_t>(i), p);
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
