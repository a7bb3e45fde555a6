// 2-D max and average pooling of the CPU backend, parallel over the N*C planes.
#include <algorithm>
#include <vector>

#include "core/cpu/common.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/dispatch.h"
#include "core/math/pool.h"
#include "core/tensor.h"

namespace mixprec {
namespace {

using cpu::kParallelWork;

// Rows and columns of one input plane.
struct Window {
  PoolSpan rows, cols;
};

struct PoolGeometry {
  int64_t planes, h, w, oh, ow;
  int64_t kh, kw, sh, sw, ph, pw;
  // The window of output (y, x), clipped to the input.
  Window window(int64_t y, int64_t x) const {
    return {pool_span(y, h, kh, sh, ph), pool_span(x, w, kw, sw, pw)};
  }
  int64_t work() const { return planes * oh * ow * kh * kw; }
};

PoolGeometry pool_geometry(const char* op, const Pool2dDesc& d, const Shape& x, const Shape& y) {
  MIXPREC_CHECK(x.size() == 4 && y.size() == 4, op, ": expected 4-D input and output, got ",
                shape_str(x), " and ", shape_str(y));
  MIXPREC_CHECK(d.kernel_h >= 1 && d.kernel_w >= 1 && d.stride_h >= 1 && d.stride_w >= 1 &&
                    d.pad_h >= 0 && d.pad_w >= 0,
                op, ": invalid kernel, stride or padding");
  PoolGeometry g{.planes = x[0] * x[1], .h = x[2], .w = x[3], .oh = y[2], .ow = y[3],
                 .kh = d.kernel_h, .kw = d.kernel_w,
                 .sh = d.stride_h, .sw = d.stride_w, .ph = d.pad_h, .pw = d.pad_w};
  MIXPREC_CHECK(g.h + 2 * g.ph >= g.kh && g.w + 2 * g.pw >= g.kw, op, ": window ", g.kh, "x", g.kw,
                " is larger than the padded input ", shape_str(x));
  MIXPREC_CHECK(y[0] == x[0] && y[1] == x[1] &&
                    g.oh == window_output_size(g.h, g.kh, g.sh, g.ph) &&
                    g.ow == window_output_size(g.w, g.kw, g.sw, g.pw),
                op, ": inconsistent shapes: input ", shape_str(x), ", output ", shape_str(y));
  return g;
}

// Calls pool(in, win, out) for every output of every plane: `in` is the plane of x, `win`
// the output's clipped window in it, `out` the output's flat index. Parallel over the planes.
template <class T, class Pool>
void for_each_window(const T* x, const PoolGeometry& g, const Pool& pool) {
#pragma omp parallel for schedule(static) if (g.work() > kParallelWork)
  for (int64_t p = 0; p < g.planes; ++p) {
    const T* in = x + p * g.h * g.w;
    for (int64_t oy = 0; oy < g.oh; ++oy)
      for (int64_t ox = 0; ox < g.ow; ++ox)
        pool(in, g.window(oy, ox), (p * g.oh + oy) * g.ow + ox);
  }
}

template <class T>
void max_pool(const T* x, T* y, int32_t* argmax, const PoolGeometry& g) {
  for_each_window(x, g, [&](const T* in, const Window& win, int64_t out) {
    MaxPoolArg best;
    for (int64_t iy = win.rows.begin; iy < win.rows.end && !best.settled(); ++iy)
      for (int64_t ix = win.cols.begin; ix < win.cols.end && !best.settled(); ++ix)
        best.offer(to_float(in[iy * g.w + ix]), iy * g.w + ix);
    y[out] = from_float<T>(best.value);
    if (argmax) argmax[out] = static_cast<int32_t>(best.index);
  });
}

template <class T>
void avg_pool(const T* x, T* y, const PoolGeometry& g) {
  const float inv_divisor = avg_pool_inv_divisor(g.kh, g.kw);
  for_each_window(x, g, [&](const T* in, const Window& win, int64_t out) {
    float sum = 0.0f;
    for (int64_t iy = win.rows.begin; iy < win.rows.end; ++iy)
      for (int64_t ix = win.cols.begin; ix < win.cols.end; ++ix) sum += to_float(in[iy * g.w + ix]);
    y[out] = from_float<T>(sum * inv_divisor);
  });
}

// Windows may overlap (stride < kernel), so each input plane is summed in FP32 and rounded
// once at the end.
template <class T>
void pool_backward(const PoolGeometry& g, bool is_max, const T* dy, const int32_t* argmax, T* dx) {
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
          const Window win = g.window(oy, ox);
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
  const PoolGeometry g = pool_geometry("pool2d", desc, x.shape(), y.shape());
  cpu::check_same_dtype("pool2d", {&x, &y});
  const bool is_max = desc.kind == PoolKind::Max;
  if (is_max && argmax) {
    MIXPREC_CHECK(argmax->dtype() == DType::I32 && argmax->shape() == y.shape(), "pool2d: argmax ",
                  describe(*argmax), " must be I32 of the output's shape ", shape_str(y.shape()));
  }
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
  const PoolGeometry g = pool_geometry("pool2d_backward", desc, dx.shape(), dy.shape());
  cpu::check_same_dtype("pool2d_backward", {&dy, &dx});
  const bool is_max = desc.kind == PoolKind::Max;
  if (is_max) {
    MIXPREC_CHECK(argmax && argmax->dtype() == DType::I32 && argmax->shape() == dy.shape(),
                  "pool2d_backward: max pooling needs the I32 argmax of the forward, shaped ",
                  shape_str(dy.shape()));
  }
  if (dx.numel() == 0) return;
  MIXPREC_DISPATCH_FLOATING(dx.dtype(), "pool2d_backward", [&] {
    pool_backward(g, is_max, static_cast<const scalar_t*>(dy.data()),
                  is_max ? argmax->data_as<int32_t>() : nullptr, static_cast<scalar_t*>(dx.data()));
  });
}

}  // namespace mixprec
