#include "cuda/kernels/pool.h"

#include "core/math/pool_geometry.h"
#include "cuda/kernels/common.cuh"

namespace mixprec::kernels {
namespace {

// One thread per output; max pooling also writes the argmax when asked.
template <bool kMax, class T>
__global__ void __launch_bounds__(kThreads) pool_kernel(const T* x, T* y, int32_t* argmax,
                                                       Pool2dGeometry g, float inv_divisor) {
  const int64_t n = g.planes * g.oh * g.ow;
  const int64_t stride = thread_stride();
  for (int64_t out = first_thread(); out < n; out += stride) {
    const int64_t ox = out % g.ow, oy = out / g.ow % g.oh, p = out / (g.ow * g.oh);
    const T* plane = x + p * g.h * g.w;
    if constexpr (kMax) {
      const MaxPoolArg best = max_pool_window(plane, g, oy, ox);
      y[out] = from_float<T>(best.value);
      if (argmax != nullptr) argmax[out] = static_cast<int32_t>(best.index);
    } else {
      y[out] = from_float<T>(avg_pool_window_sum(plane, g, oy, ox) * inv_divisor);
    }
  }
}

// One thread per input cell; the outputs covering it are visited in row-major order.
template <bool kMax, class T>
__global__ void __launch_bounds__(kThreads) pool_backward_kernel(const T* dy,
                                                                const int32_t* argmax, T* dx,
                                                                Pool2dGeometry g,
                                                                float inv_divisor) {
  const int64_t n = g.planes * g.h * g.w;
  const int64_t stride = thread_stride();
  for (int64_t i = first_thread(); i < n; i += stride) {
    const int64_t cell = i % (g.h * g.w), p = i / (g.h * g.w);
    const Pool2dWindow outs = g.covering(cell / g.w, cell % g.w);
    const int64_t plane_out = p * g.oh * g.ow;
    float acc = 0.0f;
    for (int64_t oy = outs.rows.begin; oy < outs.rows.end; ++oy) {
      for (int64_t ox = outs.cols.begin; ox < outs.cols.end; ++ox) {
        const int64_t out = plane_out + oy * g.ow + ox;
        if constexpr (kMax) {
          if (argmax[out] == cell) acc += to_float(dy[out]);
        } else {
          // The share is rounded on its own before the add, as on the CPU.
          acc += __fmul_rn(to_float(dy[out]), inv_divisor);
        }
      }
    }
    dx[i] = from_float<T>(acc);
  }
}

}  // namespace

void pool2d(PoolKind kind, DType dtype, const Pool2dGeometry& g, const void* x, void* y,
            int32_t* argmax, cudaStream_t stream) {
  const int64_t n = g.planes * g.oh * g.ow;
  if (n <= 0) return;
  MIXPREC_CUDA_DISPATCH_FLOATING(dtype, "pool2d", [&] {
    const auto* px = static_cast<const scalar_t*>(x);
    auto* py = static_cast<scalar_t*>(y);
    const float inv_divisor = avg_pool_inv_divisor(g.kh, g.kw);
    if (kind == PoolKind::Max) {
      MIXPREC_LAUNCH(grid_for(n), kThreads, stream, pool_kernel<true>)(px, py, argmax, g,
          inv_divisor);
    } else {
      MIXPREC_LAUNCH(grid_for(n), kThreads, stream, pool_kernel<false>)(px, py, nullptr, g,
          inv_divisor);
    }
    CUDA_CHECK_LAST();
  });
}

void pool2d_backward(PoolKind kind, DType dtype, const Pool2dGeometry& g, const void* dy,
                     const int32_t* argmax, void* dx, cudaStream_t stream) {
  const int64_t n = g.planes * g.h * g.w;
  if (n <= 0) return;
  const float inv_divisor = avg_pool_inv_divisor(g.kh, g.kw);
  MIXPREC_CUDA_DISPATCH_FLOATING(dtype, "pool2d_backward", [&] {
    const auto* pdy = static_cast<const scalar_t*>(dy);
    auto* pdx = static_cast<scalar_t*>(dx);
    if (kind == PoolKind::Max) {
      MIXPREC_LAUNCH(grid_for(n), kThreads, stream, pool_backward_kernel<true>)(pdy, argmax, pdx, g,
          inv_divisor);
    } else {
      MIXPREC_LAUNCH(grid_for(n), kThreads, stream, pool_backward_kernel<false>)(pdy, nullptr, pdx,
          g, inv_divisor);
    }
    CUDA_CHECK_LAST();
  });
}

}  // namespace mixprec::kernels
