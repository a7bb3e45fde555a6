// The column matrix of a 2-D convolution (im2col) and the loop over a batch's images, shared
// by the CPU backend's convolutions: the FP32 ones (core/cpu/cpu_conv.cpp) and the BF16
// dot-product ones (core/cpu/conv_bf16_dot.h).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/backend_checks.h"
#include "core/cpu/blocks.h"
#include "core/cpu/simd.h"
#include "core/half.h"

namespace mixprec::cpu {

using backend_checks::Conv2dGeometry;

// Output columns [begin, end) of one kernel column j whose input column
// iw = ow * stride - pad + j lies in [0, in); the others read the zero padding.
struct ValidRange {
  int64_t begin, end;
};

inline ValidRange valid_outputs(int64_t j, int64_t outputs, int64_t in, int64_t stride, int64_t pad) {
  const int64_t low = pad - j;            // iw >= 0  <=>  ow * stride >= low
  const int64_t high = in - 1 + pad - j;  // iw < in  <=>  ow * stride <= high
  if (high < 0) return {0, 0};
  const int64_t begin = low <= 0 ? 0 : (low + stride - 1) / stride;
  const int64_t end = std::min(outputs, high / stride + 1);
  return {std::min(begin, end), end};
}

// n elements of src into dst: copied when D is T, else widened to FP32.
template <class T, class D>
void copy_into(const T* src, D* dst, int64_t n) {
  if constexpr (std::is_same_v<T, D>) {
    std::copy(src, src + n, dst);
  } else {
    static_assert(std::is_same_v<D, float>, "copy_into: a column matrix of T or of FP32");
    load_f32(src, dst, n);
  }
}

// A stride-1 convolution whose output rows are as wide as the input's (a "same" padding,
// the 3x3 pad-1 case among them) has a column matrix row (c, i, j) that is the input plane
// c shifted by di = i - PH rows and dj = j - PW columns: entry f = oh * OW + ow reads input
// cell f + di * W + dj of the flat plane. So each row is one contiguous copy, after which the
// entries that read the padding (the first rows or the last ones, and the |dj| border
// columns, whose flat shift wrapped into a neighbouring input row) are zeroed.
inline bool is_flat_shift(const Conv2dGeometry& g) {
  return g.sh == 1 && g.sw == 1 && g.ow == g.w;
}

// The part of column matrix row (i, j) of a flat-shift convolution that reads the image:
// output rows [row_begin, row_end), and within them the flat entries [first, last) whose
// flat shift stays inside the plane.
struct ShiftedRow {
  int64_t di, dj, shift;
  int64_t row_begin, row_end;
  int64_t first, last;
};

inline ShiftedRow shifted_row(const Conv2dGeometry& g, int64_t i, int64_t j) {
  ShiftedRow r;
  r.di = i - g.ph;
  r.dj = j - g.pw;
  r.shift = r.di * g.w + r.dj;
  r.row_begin = std::clamp<int64_t>(-r.di, 0, g.oh);
  r.row_end = std::clamp<int64_t>(g.h - r.di, r.row_begin, g.oh);
  r.first = std::min(r.row_begin * g.ow + std::max<int64_t>(0, -r.dj), r.row_end * g.ow);
  r.last = std::max(r.row_end * g.ow - std::max<int64_t>(0, r.dj), r.first);
  return r;
}

// Zeroes the border columns of rows [row_begin, row_end) of one column matrix row: the
// entries whose input column ow + dj falls outside [0, W).
template <class D>
void zero_border_columns(D* row, const Conv2dGeometry& g, const ShiftedRow& r) {
  if (r.dj == 0) return;
  const int64_t begin = r.dj < 0 ? 0 : std::max<int64_t>(0, g.ow - r.dj);
  const int64_t end = r.dj < 0 ? std::min(g.ow, -r.dj) : g.ow;
  for (int64_t oh = r.row_begin; oh < r.row_end; ++oh)
    std::fill(row + oh * g.ow + begin, row + oh * g.ow + end, from_float<D>(0.0f));
}

// col[(c*KH + i)*KW + j][oh*OW + ow] = x[c][oh*SH - PH + i][ow*SW - PW + j], 0 in the padding;
// the column matrix is FP32 (D = float) or of x's own type.
template <class T, class D>
void im2col(const T* x, const Conv2dGeometry& g, D* col) {
  const int64_t pixels = g.pixels();
  const D zero = from_float<D>(0.0f);
  if (is_flat_shift(g)) {
    for (int64_t i = 0; i < g.kh; ++i) {
      for (int64_t j = 0; j < g.kw; ++j) {
        const ShiftedRow r = shifted_row(g, i, j);
        for (int64_t c = 0; c < g.c; ++c) {
          D* row = col + ((c * g.kh + i) * g.kw + j) * pixels;
          std::fill(row, row + r.first, zero);
          copy_into(x + c * g.h * g.w + r.first + r.shift, row + r.first, r.last - r.first);
          std::fill(row + r.last, row + pixels, zero);
          zero_border_columns(row, g, r);
        }
      }
    }
    return;
  }
  // Otherwise row by row: the output columns that read inside the image are worked out once
  // per kernel column, so the copy itself has no bounds test.
  for (int64_t j = 0; j < g.kw; ++j) {
    const ValidRange cols = valid_outputs(j, g.ow, g.w, g.sw, g.pw);
    const int64_t first_iw = cols.begin * g.sw - g.pw + j;
    for (int64_t c = 0; c < g.c; ++c) {
      for (int64_t i = 0; i < g.kh; ++i) {
        D* row = col + ((c * g.kh + i) * g.kw + j) * pixels;
        for (int64_t oh = 0; oh < g.oh; ++oh) {
          D* out = row + oh * g.ow;
          const int64_t ih = oh * g.sh - g.ph + i;
          if (ih < 0 || ih >= g.h) {
            std::fill(out, out + g.ow, zero);
            continue;
          }
          const T* in = x + (c * g.h + ih) * g.w + first_iw;
          std::fill(out, out + cols.begin, zero);
          if (g.sw == 1) {
            copy_into(in, out + cols.begin, cols.end - cols.begin);
          } else {
            for (int64_t ow = cols.begin; ow < cols.end; ++ow)
              out[ow] = from_float<D>(to_float(in[(ow - cols.begin) * g.sw]));
          }
          std::fill(out + cols.end, out + g.ow, zero);
        }
      }
    }
  }
}

// Sum of n floats in kLanes lanes (core/cpu/simd.h), lanes added in order.
inline float lane_sum(const float* v, int64_t n) {
  Floats8 acc = {};
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes) {
    Floats8 x;
    load8(v + k, x);
    acc += x;
  }
  for (; k < n; ++k) acc[k % kLanes] += v[k];
  return lane_total(acc);
}

// Images are independent, so a batch spreads over `threads` threads (each GEMM then runs on
// its thread); a single image leaves the threads to the GEMM. The serial path opens no
// parallel region: Eigen's threads, nested inside a one-thread team, measured slower than
// when started at the top level. `body(n, worker)` takes its buffers from the calling
// thread's scratch slots; `worker` in [0, threads) is the thread's number in the team opened
// here, 0 on the serial path. It is never the caller's own omp_get_thread_num(), which inside
// an enclosing parallel region numbers the outer team.
template <class Body>
void for_each_image(int64_t images, int threads, const Body& body) {
  if (images > 1 && threads > 1) {
#pragma omp parallel num_threads(threads)
    {
      const int worker = omp_get_thread_num();
#pragma omp for schedule(static)
      for (int64_t n = 0; n < images; ++n) body(n, worker);
    }
  } else {
    for (int64_t n = 0; n < images; ++n) body(n, 0);
  }
}

// Threads for a batch of `images`. Inside a parallel region that may not nest another
// active one, a team opened here would have one thread, so plan for one.
inline int image_threads(int64_t images) {
  const int available =
      omp_get_active_level() >= omp_get_max_active_levels() ? 1 : omp_get_max_threads();
  return static_cast<int>(std::min<int64_t>(available, std::max<int64_t>(images, 1)));
}

}  // namespace mixprec::cpu
