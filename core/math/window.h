// Geometry of a sliding window (convolution and pooling), shared by the ops that size their
// outputs and the kernels of both backends.
#pragma once

#include <cstdint>

#include "core/hd.h"

namespace mixprec {

// Output extent along one dimension: (in + 2 pad - kernel) / stride + 1, rounded down.
// Requires stride >= 1, pad >= 0 and in + 2 pad >= kernel (so the result is >= 1).
MIXPREC_HD int64_t window_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad) {
  return (in + 2 * pad - kernel) / stride + 1;
}

}  // namespace mixprec
