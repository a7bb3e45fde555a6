// The arithmetic of the collectives, apart from how the bytes travel: the contiguous shard of
// a buffer that each rank reduces, the rank-ordered FP32 sum of one shard, and the F32 maximum
// in which NaN wins. Free of MPI, so that it is tested in one process.
#pragma once

#include <cstdint>

namespace mixprec::dist {

// Elements [begin, begin + size) of a buffer.
struct Shard {
  int64_t begin = 0;
  int64_t size = 0;
};

// Shard `index` of `numel` elements split into `parts` contiguous shards in order, sizes
// differing by at most one (a shard is empty when numel < parts).
Shard shard_of(int64_t numel, int parts, int index);

// `runs` holds `parts` runs of `size` floats one after another (run q from rank q):
// out[i] = ((+0 + runs[0][i]) + runs[1][i]) + ... + runs[parts-1][i], each addition rounded to
// FP32 in that order, the bits of a serial left-to-right sum. `out` may not overlap `runs`.
void add_in_rank_order(const float* runs, int parts, int64_t size, float* out);

// The larger of a and b in the order -inf < ... < -0 < +0 < ... < +inf, with NaN (the default
// quiet NaN, whatever the payload in) above every number. Commutative and associative to the
// bit, so every reduction tree of an all-reduce gives every rank the same bits.
float max_nan_wins(float a, float b);

}  // namespace mixprec::dist
