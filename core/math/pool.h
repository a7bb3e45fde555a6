// Per-element math of 2-D max and average pooling, shared by the CPU and CUDA backends.
// Conventions follow PyTorch's defaults: floor-mode output sizes; max pooling ignores padded
// cells and lets a NaN win; average pooling divides by the full kernel area, padded cells
// included (count_include_pad=True). Each spatial dimension is handled on its own, so a
// kernel calls pool_span (and window_output_size, core/math/window.h) once for rows and once
// for columns.
#pragma once

#include <math.h>

#include <cstdint>

#include "core/hd.h"
#include "core/math/window.h"

namespace mixprec {

// Input indices [begin, end) that output index `out` covers along one dimension: the window
// [out * stride - pad, out * stride - pad + kernel) clipped to the input [0, in). It is empty
// (begin >= end) only when the window lies entirely in the padding, which needs
// pad > kernel / 2.
struct PoolSpan {
  int64_t begin, end;
};

MIXPREC_HD PoolSpan pool_span(int64_t out, int64_t in, int64_t kernel, int64_t stride,
                              int64_t pad) {
  const int64_t start = out * stride - pad;
  const int64_t stop = start + kernel;
  return {start > 0 ? start : 0, stop < in ? stop : in};
}

// 1 / divisor of average pooling: the full kernel area, padded cells included, so a window
// that overhangs the input averages its cells with zeros. The forward multiplies the window
// sum by it; the backward gives every covered input cell dy times it.
MIXPREC_HD float avg_pool_inv_divisor(int64_t kernel_h, int64_t kernel_w) {
  return 1.0f / static_cast<float>(kernel_h * kernel_w);
}

// The running maximum of one max-pooling window and where it was found. Offer the window's
// cells in row-major order. A larger value replaces the maximum, so among equal maxima the
// first cell wins (its index is the argmax the backward routes dy to). The first NaN wins
// and is final, as in PyTorch: a NaN in the window is never hidden. A window with no cells
// keeps -inf and index -1, and the backward routes nothing from it.
struct MaxPoolArg {
  float value = -INFINITY;
  int64_t index = -1;

  MIXPREC_HD void offer(float v, int64_t at) {
    if (index < 0 || v > value || (isnan(v) && !isnan(value))) {
      value = v;
      index = at;
    }
  }

  // True once no later cell can change the result (a NaN was taken), so a kernel may stop.
  MIXPREC_HD bool settled() const { return isnan(value); }
};

}  // namespace mixprec
