// How the embedding backward divides each vocabulary row's run of positions, shared by the
// CPU and CUDA backends so that both add the same values in the same order. A row's run of
// `length` positions (in increasing position order) is cut into `splits` consecutive parts;
// each part is summed in FP32 from 0 in order, and the parts are added from 0 in part order
// (with one part, its sum is the total). On a GPU a thread sums one part of one column, so a
// frequent id (the space of a character corpus: thousands of positions) no longer leaves one
// thread to walk its whole run while the rest of the device waits.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/hd.h"

namespace mixprec {

inline constexpr int64_t kEmbeddingMaxSplits = 64;
// Bound on the partial sums a split backward keeps (floats).
inline constexpr int64_t kEmbeddingMaxPartialFloats = int64_t{1} << 24;

// Parts per row for `count` positions into a [vocab, dim] table: about one per four positions
// of an average row, at most kEmbeddingMaxSplits, and at least 1; the partial sums
// (parts * vocab * dim floats) stay within kEmbeddingMaxPartialFloats.
inline int64_t embedding_backward_splits(int64_t count, int64_t vocab, int64_t dim) {
  if (count <= 0 || vocab <= 0 || dim <= 0) return 1;
  int64_t splits = std::min(count / (4 * vocab), kEmbeddingMaxSplits);
  splits = std::min(splits, kEmbeddingMaxPartialFloats / (vocab * dim));
  return std::max<int64_t>(splits, 1);
}

// The first position (relative to the run's start) of part `split` of a run of `length`;
// part s covers [embedding_split_begin(length, s, S), embedding_split_begin(length, s + 1, S)).
MIXPREC_HD int64_t embedding_split_begin(int64_t length, int64_t split, int64_t splits) {
  return length * split / splits;
}

}  // namespace mixprec
