// The keys and values a GPT has computed for the positions it has already read, so that
// generating one more token costs one position rather than a re-run of the whole prefix.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace mixprec {

// One attention layer's cache: k and v [B, H, length, D] in the working dtype, on the
// model's device; undefined while empty.
struct LayerKv {
  Tensor keys, values;
};

// GPT::forward_cached's state: one LayerKv per block and the positions cached so far.
struct KvCache {
  std::vector<LayerKv> layers;
  int64_t length = 0;

  void clear() {
    layers.clear();
    length = 0;
  }
};

}  // namespace mixprec
