// How the embedding backward divides each vocabulary row's run of positions, shared by the
// CPU and CUDA backends so that both add the same values in the same order. A row's run of
// `length` positions (in increasing position order) is cut into `parts` consecutive parts;
// each part is summed in FP32 from 0 in order, and the parts are added from 0 in part order
// (with one part, its sum is the total). On a GPU a thread sums one part of one column, so a
// frequent id (the space of a character corpus: thousands of positions) no longer leaves one
// thread to walk its whole run while the rest of the device waits.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/hd.h"

namespace mixprec {

inline constexpr int64_t kEmbeddingMaxParts = 64;
// Bound on the partial sums a backward in parts keeps (floats).
inline constexpr int64_t kEmbeddingMaxPartialFloats = int64_t{1} << 24;

// Parts per row for `count` positions into a [vocab, dim] table: about one per four positions
// of an average row, at most kEmbeddingMaxParts, and at least 1; the partial sums
// (parts * vocab * dim floats) stay within kEmbeddingMaxPartialFloats.
inline int64_t embedding_backward_parts(int64_t count, int64_t vocab, int64_t dim) {
  if (count <= 0 || vocab <= 0 || dim <= 0) return 1;
  int64_t parts = std::min(count / (4 * vocab), kEmbeddingMaxParts);
  parts = std::min(parts, kEmbeddingMaxPartialFloats / (vocab * dim));
  return std::max<int64_t>(parts, 1);
}

// The first position (relative to the run's start) of part `part` of a run of `length`;
// part s covers [embedding_part_begin(length, s, S), embedding_part_begin(length, s + 1, S)).
MIXPREC_HD int64_t embedding_part_begin(int64_t length, int64_t part, int64_t parts) {
  return length * part / parts;
}

}  // namespace mixprec
