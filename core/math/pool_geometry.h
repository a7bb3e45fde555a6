// Geometry of one 2-D pooling call (core/backend.h's Pool2dDesc applied to an [N, C, H, W]
// input), shared by the CPU and CUDA kernels: which input cells each output window covers
// (forward) and which outputs cover each input cell (the gather form of the backward), and
// the forward's scan of one window. Validation of the shapes is core/backend_checks.h's.
#pragma once

#include <cstdint>

#include "core/half.h"
#include "core/hd.h"
#include "core/math/pool.h"

namespace mixprec {

// The clipped window of one output: input rows and columns of its plane.
struct Pool2dWindow {
  PoolSpan rows, cols;
};

// Outputs [begin, end) along one dimension whose windows contain input index `in_index`:
// out * stride - pad <= in_index < out * stride - pad + kernel, within [0, outputs).
MIXPREC_HD PoolSpan pool_covering(int64_t in_index, int64_t outputs, int64_t kernel,
                                  int64_t stride, int64_t pad) {
  const int64_t low = in_index + pad - kernel + 1;  // smallest out * stride allowed
  const int64_t first = low <= 0 ? 0 : (low + stride - 1) / stride;
  const int64_t last = (in_index + pad) / stride;   // in_index + pad >= 0
  return {first, last + 1 < outputs ? last + 1 : outputs};
}

struct Pool2dGeometry {
  int64_t planes = 0, h = 0, w = 0, oh = 0, ow = 0;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0;

  // The window of output (y, x), clipped to the input.
  MIXPREC_HD Pool2dWindow window(int64_t y, int64_t x) const {
    return {pool_span(y, h, kh, sh, ph), pool_span(x, w, kw, sw, pw)};
  }
  // The outputs whose windows contain input cell (y, x), in rows and columns.
  MIXPREC_HD Pool2dWindow covering(int64_t y, int64_t x) const {
    return {pool_covering(y, oh, kh, sh, ph), pool_covering(x, ow, kw, sw, pw)};
  }
  // Window cells visited by the forward: a measure of the work.
  MIXPREC_HD int64_t work() const { return planes * oh * ow * kh * kw; }
};

// Max pooling of output (oy, ox) of one plane (row-major, g.w columns): its window's cells
// offered in row-major order, stopping once a NaN is taken.
template <class T>
MIXPREC_HD MaxPoolArg max_pool_window(const T* plane, const Pool2dGeometry& g, int64_t oy,
                                      int64_t ox) {
  const Pool2dWindow win = g.window(oy, ox);
  MaxPoolArg best;
  for (int64_t iy = win.rows.begin; iy < win.rows.end && !best.settled(); ++iy)
    for (int64_t ix = win.cols.begin; ix < win.cols.end && !best.settled(); ++ix)
      best.offer(to_float(plane[iy * g.w + ix]), iy * g.w + ix);
  return best;
}

// The FP32 sum of the cells in the window of output (oy, ox), in row-major order; the
// average is it times avg_pool_inv_divisor.
template <class T>
MIXPREC_HD float avg_pool_window_sum(const T* plane, const Pool2dGeometry& g, int64_t oy,
                                     int64_t ox) {
  const Pool2dWindow win = g.window(oy, ox);
  float sum = 0.0f;
  for (int64_t iy = win.rows.begin; iy < win.rows.end; ++iy)
    for (int64_t ix = win.cols.begin; ix < win.cols.end; ++ix)
      sum += to_float(plane[iy * g.w + ix]);
  return sum;
}

}  // namespace mixprec
