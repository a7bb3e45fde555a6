// Per-element math of dropout, shared by the CPU and CUDA backends. Element i keeps its value
// when the Philox draw for counter `offset + i` is at least p, so a (seed, offset) key fixes
// the mask on every backend and for any thread count; the backward replays the same key.
#pragma once

#include <cstdint>

#include "core/hd.h"
#include "core/philox.h"

namespace mixprec {

// True when element `counter` survives (probability 1 - p).
MIXPREC_HD bool dropout_keep(uint64_t seed, uint64_t counter, float p) {
  return !(philox_uniform(seed, counter) < p);
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
