// 2-D max and average pooling of the CPU backend, parallel over the N*C planes.
//
// Two fast paths cover the CNNs' usual downsampling; every other geometry takes the generic
// window scan of core/math/pool_geometry.h, which the fast paths reproduce bit for bit:
//   forward:  2x2 windows at stride 2 without padding (no window is clipped);
//   backward: max pooling whose windows do not overlap (stride >= kernel), where each input
//             cell receives at most one gradient and needs no accumulator.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "core/backend_checks.h"
#include "core/cpu/blocks.h"
#include "core/cpu/common.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/dispatch.h"
#include "core/math/pool_geometry.h"
#include "core/tensor.h"

namespace mixprec {
namespace {

using cpu::kParallelWork;

// Calls pool(plane, oy, ox, out) for every output of every plane: `plane` is the plane's
// input, (oy, ox) the output's position in it and `out` its flat index. Parallel over the
// planes.
template <class T, class Pool>
void for_each_output(const T* x, const Pool2dGeometry& g, const Pool& pool) {
#pragma omp parallel for schedule(static) if (g.work() > kParallelWork)
  for (int64_t p = 0; p < g.planes; ++p) {
    const T* plane = x + p * g.h * g.w;
    for (int64_t oy = 0; oy < g.oh; ++oy)
      for (int64_t ox = 0; ox < g.ow; ++ox) pool(plane, oy, ox, (p * g.oh + oy) * g.ow + ox);
  }
}

// Input cells per row pair of a block of the 2x2 path (a block is as many output rows as fit):
// its FP32 buffers stay on the stack.
constexpr int64_t kPoolBlock = 1024;

bool is_max_pool_2x2(const Pool2dGeometry& g) {
  return g.kh == 2 && g.kw == 2 && g.sh == 2 && g.sw == 2 && g.ph == 0 && g.pw == 0 &&
         g.w <= kPoolBlock;
}

// Max pooling in 2x2 windows at stride 2, in two passes over a block of output rows (see
// below), each a long contiguous loop of selects that vectorises:
//   vertical:   each window column's two cells (top, bottom) reduce to one cell and its plane
//               index, the last input column of an odd width dropped, so a row of the result
//               holds exactly 2 * ow cells and the block is one flat array;
//   horizontal: adjacent pairs of that array reduce to the window's maximum.
// The winner is the generic scan's (MaxPoolArg, cells in row-major order): the first NaN,
// else the largest value, the smaller plane index among equal ones. The vertical pass keeps
// the top cell unless the bottom one is larger or a NaN below a number; the horizontal pass
// compares the two survivors by value and breaks ties (equal values, or two NaNs) by index,
// which in row-major order may put the right column's top cell before the left's bottom one.
// The indices decide ties between +0 and -0 and between NaNs too, so they are tracked even
// when no argmax is asked for.
//
// A block is `rows` consecutive output rows from row q0 of the [planes * oh] rows, read from
// `rows` pairs of input rows that follow each other from `input` on: within one plane, or,
// when h is even, across planes as well (each plane is then exactly oh row pairs).
template <class T, bool kArgmax>
void max_pool_2x2_block(const T* input, const Pool2dGeometry& g, int64_t q0, int64_t rows,
                        T* y, int32_t* argmax) {
  const int64_t cols = 2 * g.ow;  // input columns that windows cover
  float column[kPoolBlock];
  int32_t column_at[kPoolBlock];
  // The block's input rows, contiguous, widened in one call (16-bit data).
  float in_buf[2 * kPoolBlock];
  const float* in = cpu::load_f32(input, in_buf, 2 * rows * g.w);
  // Row r of the block is row (q0 + r) % oh of its plane, taken plane by plane: a division,
  // or a wrapped counter, inside the row loop makes GCC's code for it twice as slow.
  const int32_t width = static_cast<int32_t>(g.w);
  for (int64_t r = 0, oy = q0 % g.oh; r < rows; oy = 0) {
    const int64_t run = std::min(rows - r, g.oh - oy);
    for (int64_t j = 0; j < run; ++j, ++r) {
      const float* top = in + 2 * r * g.w;
      const float* bottom = top + g.w;
      float* v = column + r * cols;
      int32_t* at = column_at + r * cols;
      const int32_t top_at = static_cast<int32_t>(2 * (oy + j) * g.w);
      for (int64_t c = 0; c < cols; ++c) {
        const bool take = top[c] == top[c] && !(bottom[c] <= top[c]);
        v[c] = take ? bottom[c] : top[c];
        at[c] = top_at + (take ? width : 0) + static_cast<int32_t>(c);
      }
    }
  }
  const int64_t outputs = rows * g.ow;
  float out_buf[kPoolBlock / 2];
  float* out = cpu::f32_target(y, out_buf);
  // Bitwise rather than short-circuit logic: GCC vectorises only this form of the loop.
  for (int64_t i = 0; i < outputs; ++i) {
    const float left = column[2 * i], right = column[2 * i + 1];
    const int32_t left_at = column_at[2 * i], right_at = column_at[2 * i + 1];
    const int left_nan = left != left, right_nan = right != right;
    const int tie = (right == left) | (left_nan & right_nan);
    const int take = ((left == left) & (right_nan | (right > left))) | (tie & (right_at < left_at));
    out[i] = take ? right : left;
    if constexpr (kArgmax) argmax[i] = take ? right_at : left_at;
  }
  cpu::store_f32(out, y, outputs);
}

// With an even h the blocks run through the planes as one sequence of row pairs, so that the
// small planes of a CNN's later layers (14x14 and less) still fill whole blocks instead of
// paying a block's fixed costs for a few rows each.
template <class T, bool kArgmax>
void max_pool_2x2(const T* x, T* y, int32_t* argmax, const Pool2dGeometry& g) {
  const int64_t block_rows = kPoolBlock / g.w;
  const auto block = [&](const T* input, int64_t q0, int64_t rows) {
    const int64_t out = q0 * g.ow;
    max_pool_2x2_block<T, kArgmax>(input, g, q0, rows, y + out, kArgmax ? argmax + out : nullptr);
  };
  if (g.h % 2 == 0) {
    const int64_t total = g.planes * g.oh, blocks = (total + block_rows - 1) / block_rows;
#pragma omp parallel for schedule(static) if (g.work() > kParallelWork)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t q0 = b * block_rows;
      block(x + q0 * 2 * g.w, q0, std::min(block_rows, total - q0));
    }
    return;
  }
#pragma omp parallel for schedule(static) if (g.work() > kParallelWork)
  for (int64_t p = 0; p < g.planes; ++p) {
    for (int64_t oy0 = 0; oy0 < g.oh; oy0 += block_rows) {
      block(x + (p * g.h + 2 * oy0) * g.w, p * g.oh + oy0, std::min(block_rows, g.oh - oy0));
    }
  }
}

template <class T>
void max_pool(const T* x, T* y, int32_t* argmax, const Pool2dGeometry& g) {
  if (is_max_pool_2x2(g)) {
    if (argmax) return max_pool_2x2<T, true>(x, y, argmax, g);
    return max_pool_2x2<T, false>(x, y, nullptr, g);
  }
  for_each_output(x, g, [&](const T* plane, int64_t oy, int64_t ox, int64_t out) {
    const MaxPoolArg best = max_pool_window(plane, g, oy, ox);
    y[out] = from_float<T>(best.value);
    if (argmax) argmax[out] = static_cast<int32_t>(best.index);
  });
}

template <class T>
void avg_pool(const T* x, T* y, const Pool2dGeometry& g) {
  const float inv_divisor = avg_pool_inv_divisor(g.kh, g.kw);
  for_each_output(x, g, [&](const T* plane, int64_t oy, int64_t ox, int64_t out) {
    y[out] = from_float<T>(avg_pool_window_sum(plane, g, oy, ox) * inv_divisor);
  });
}

// Max pooling with windows that do not overlap: each input cell is the argmax of at most one
// output, so a plane is zeroed and each gradient stored at its argmax. It is stored as
// 0 + dy, the generic path's sum, so that a -0 gradient lands as +0 there too. 16-bit planes
// go through FP32 buffers, converted a plane at a time.
template <class T>
void max_pool_backward_disjoint(const Pool2dGeometry& g, const T* dy, const int32_t* argmax,
                                T* dx) {
  const int64_t plane = g.h * g.w, outputs = g.oh * g.ow;
  constexpr bool kF32 = std::is_same_v<T, float>;
#pragma omp parallel if (g.planes * (plane + outputs) > cpu::kParallelWorkCheap)
  {
    std::vector<float> plane_buf(kF32 ? 0 : static_cast<size_t>(plane));
    std::vector<float> grad_buf(kF32 ? 0 : static_cast<size_t>(outputs));
#pragma omp for schedule(static)
    for (int64_t p = 0; p < g.planes; ++p) {
      float* out = cpu::f32_target(dx + p * plane, plane_buf.data());
      std::fill(out, out + plane, 0.0f);
      const float* grads = cpu::load_f32(dy + p * outputs, grad_buf.data(), outputs);
      const int32_t* at = argmax + p * outputs;
      for (int64_t i = 0; i < outputs; ++i)
        if (at[i] >= 0) out[at[i]] = 0.0f + grads[i];
      cpu::store_f32(out, dx + p * plane, plane);
    }
  }
}

// Windows may overlap (stride < kernel), so each input plane is summed in FP32 and rounded
// once at the end.
template <class T>
void pool_backward(const Pool2dGeometry& g, bool is_max, const T* dy, const int32_t* argmax,
                   T* dx) {
  const float inv_divisor = avg_pool_inv_divisor(g.kh, g.kw);
  const int64_t plane = g.h * g.w;
#pragma omp parallel if (g.work() > kParallelWork)
  {
    std::vector<float> acc(static_cast<size_t>(plane));
#pragma omp for schedule(static)
    for (int64_t p = 0; p < g.planes; ++p) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t oy = 0; oy < g.oh; ++oy) {
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          const int64_t out = (p * g.oh + oy) * g.ow + ox;
          const float grad = to_float(dy[out]);
          if (is_max) {
            if (argmax[out] >= 0) acc[argmax[out]] += grad;
            continue;
          }
          const Pool2dWindow win = g.window(oy, ox);
          const float share = grad * inv_divisor;
          for (int64_t iy = win.rows.begin; iy < win.rows.end; ++iy)
            for (int64_t ix = win.cols.begin; ix < win.cols.end; ++ix) acc[iy * g.w + ix] += share;
        }
      }
      T* out = dx + p * plane;
      for (int64_t i = 0; i < plane; ++i) out[i] = from_float<T>(acc[i]);
    }
  }
}

}  // namespace

void CpuBackend::pool2d(const Pool2dDesc& desc, const Tensor& x, Tensor& y, Tensor* argmax) {
  const Pool2dGeometry g = backend_checks::pool2d(kCPU, desc, x, y, argmax);
  const bool is_max = desc.kind == PoolKind::Max;
  if (y.numel() == 0) return;
  MIXPREC_DISPATCH_FLOATING(x.dtype(), "pool2d", [&] {
    const auto* in = static_cast<const scalar_t*>(x.data());
    auto* out = static_cast<scalar_t*>(y.data());
    if (is_max) {
      max_pool(in, out, argmax ? argmax->data_as<int32_t>() : nullptr, g);
    } else {
      avg_pool(in, out, g);
    }
  });
}

void CpuBackend::pool2d_backward(const Pool2dDesc& desc, const Tensor& dy, const Tensor* argmax,
                                 Tensor& dx) {
  const Pool2dGeometry g = backend_checks::pool2d_backward(kCPU, desc, dy, argmax, dx);
  const bool is_max = desc.kind == PoolKind::Max;
  if (dx.numel() == 0) return;
  const bool disjoint = g.sh >= g.kh && g.sw >= g.kw;
  MIXPREC_DISPATCH_FLOATING(dx.dtype(), "pool2d_backward", [&] {
    if (is_max && disjoint) {
      return max_pool_backward_disjoint(g, static_cast<const scalar_t*>(dy.data()),
                                        argmax->data_as<int32_t>(),
                                        static_cast<scalar_t*>(dx.data()));
    }
    pool_backward(g, is_max, static_cast<const scalar_t*>(dy.data()),
                  is_max ? argmax->data_as<int32_t>() : nullptr, static_cast<scalar_t*>(dx.data()));
  });
}

}  // namespace mixprec
