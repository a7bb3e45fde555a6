// 2-D max and average pooling of the CPU backend, parallel over the N*C planes.
#include <algorithm>
#include <vector>

#include "core/backend_checks.h"
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

template <class T>
void max_pool(const T* x, T* y, int32_t* argmax, const Pool2dGeometry& g) {
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
  MIXPREC_DISPATCH_FLOATING(dx.dtype(), "pool2d_backward", [&] {
    pool_backward(g, is_max, static_cast<const scalar_t*>(dy.data()),
                  is_max ? argmax->data_as<int32_t>() : nullptr, static_cast<scalar_t*>(dx.data()));
  });
}

}  // namespace mixprec
