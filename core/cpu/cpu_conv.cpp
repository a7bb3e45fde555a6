// 2-D convolution of the CPU backend: im2col + FP32 GEMM, parallel over the batch.
//
// Per image n (K = C*KH*KW rows of the column matrix, P = OH*OW output pixels):
//   forward:         y[n] (O x P)  = W (O x K) @ col(x[n]) (K x P) + bias
//   backward data:   dx[n]         = col2im(W^T (K x O) @ dy[n] (O x P))
//   backward filter: dW (O x K)    = sum_n dy[n] @ col(x[n])^T, dbias = sum_n,p dy[n]
// Every sum is in FP32 and each output element is rounded once to the tensor's dtype.
#include <omp.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "core/backend_checks.h"
#include "core/cpu/blocks.h"
#include "core/cpu/common.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/cpu_gemm.h"
#include "core/cpu/dispatch.h"
#include "core/tensor.h"

namespace mixprec {
namespace {

using backend_checks::Conv2dGeometry;

// Scratch slots (core/cpu/cpu_gemm.h) of the buffers that are live together in one kernel.
constexpr int kFilterSlot = 0;  // the calling thread only
constexpr int kColumnSlot = 1;
constexpr int kOutputSlot = 2;
constexpr int kInputSlot = 3;

// The calling thread's scratch `slot` as the FP32 buffer of n elements of a T operand
// (core/cpu/blocks.h): none for FP32, which is used in place.
template <class T>
float* f32_scratch(int slot, int64_t n) {
  if constexpr (std::is_same_v<T, float>) return nullptr;
  else return cpu::scratch(slot, n);
}

// col[(c*KH + i)*KW + j][oh*OW + ow] = x[c][oh*SH - PH + i][ow*SW - PW + j], 0 in the padding.
template <class T>
void im2col(const T* x, const Conv2dGeometry& g, float* col) {
  const int64_t pixels = g.pixels();
  for (int64_t c = 0; c < g.c; ++c) {
    for (int64_t i = 0; i < g.kh; ++i) {
      for (int64_t j = 0; j < g.kw; ++j) {
        float* row = col + ((c * g.kh + i) * g.kw + j) * pixels;
        for (int64_t oh = 0; oh < g.oh; ++oh) {
          float* out = row + oh * g.ow;
          const int64_t ih = oh * g.sh - g.ph + i;
          if (ih < 0 || ih >= g.h) {
            std::fill(out, out + g.ow, 0.0f);
            continue;
          }
          const T* in = x + (c * g.h + ih) * g.w;
          for (int64_t ow = 0; ow < g.ow; ++ow) {
            const int64_t iw = ow * g.sw - g.pw + j;
            out[ow] = iw >= 0 && iw < g.w ? to_float(in[iw]) : 0.0f;
          }
        }
      }
    }
  }
}

// The adjoint of im2col: adds every column entry back into the input cell it came from.
void col2im_add(const float* col, const Conv2dGeometry& g, float* dx) {
  const int64_t pixels = g.pixels();
  for (int64_t c = 0; c < g.c; ++c) {
    for (int64_t i = 0; i < g.kh; ++i) {
      for (int64_t j = 0; j < g.kw; ++j) {
        const float* row = col + ((c * g.kh + i) * g.kw + j) * pixels;
        for (int64_t oh = 0; oh < g.oh; ++oh) {
          const int64_t ih = oh * g.sh - g.ph + i;
          if (ih < 0 || ih >= g.h) continue;
          const float* in = row + oh * g.ow;
          float* out = dx + (c * g.h + ih) * g.w;
          for (int64_t ow = 0; ow < g.ow; ++ow) {
            const int64_t iw = ow * g.sw - g.pw + j;
            if (iw >= 0 && iw < g.w) out[iw] += in[ow];
          }
        }
      }
    }
  }
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
int image_threads(int64_t images) {
  const int available =
      omp_get_active_level() >= omp_get_max_active_levels() ? 1 : omp_get_max_threads();
  return static_cast<int>(std::min<int64_t>(available, std::max<int64_t>(images, 1)));
}

template <class T>
void conv_forward(const T* x, const T* w, const T* bias, T* y, const Conv2dGeometry& g) {
  const int64_t w_size = g.o * g.rows();
  const float* w32 = cpu::load_f32_parallel(w, f32_scratch<T>(kFilterSlot, w_size), w_size);
  std::vector<float> bias_buf(static_cast<size_t>(bias ? g.o : 0));
  const float* bias32 = bias ? cpu::load_f32(bias, bias_buf.data(), g.o) : nullptr;
  const int64_t out_size = g.o * g.pixels();
  for_each_image(g.n, image_threads(g.n), [&](int64_t n, int) {
    float* col = cpu::scratch(kColumnSlot, g.rows() * g.pixels());
    im2col(x + n * g.image(), g, col);
    float* out = cpu::f32_target(y + n * out_size, f32_scratch<T>(kOutputSlot, out_size));
    float beta = 0.0f;
    if (bias) {
      for (int64_t o = 0; o < g.o; ++o)
        std::fill(out + o * g.pixels(), out + (o + 1) * g.pixels(), bias32[o]);
      beta = 1.0f;
    }
    cpu::gemm_f32(false, false, g.o, g.pixels(), g.rows(), 1.0f, w32, col, beta, out);
    cpu::store_f32_parallel(out, y + n * out_size, out_size);
  });
}

// dy[n] as FP32: the tensor itself for FP32, else widened into the thread's scratch.
template <class T>
const float* output_grad_f32(const T* dy, int64_t n, int64_t size) {
  return cpu::load_f32_parallel(dy + n * size, f32_scratch<T>(kOutputSlot, size), size);
}

template <class T>
void conv_backward_data(const T* dy, const T* w, T* dx, const Conv2dGeometry& g) {
  const int64_t w_size = g.o * g.rows();
  const float* w32 = cpu::load_f32_parallel(w, f32_scratch<T>(kFilterSlot, w_size), w_size);
  const int64_t dy_size = g.o * g.pixels();
  for_each_image(g.n, image_threads(g.n), [&](int64_t n, int) {
    const float* dyn = output_grad_f32(dy, n, dy_size);
    float* col = cpu::scratch(kColumnSlot, g.rows() * g.pixels());
    cpu::gemm_f32(true, false, g.rows(), g.pixels(), g.o, 1.0f, w32, dyn, 0.0f, col);
    float* dxn = cpu::f32_target(dx + n * g.image(), f32_scratch<T>(kInputSlot, g.image()));
    std::fill(dxn, dxn + g.image(), 0.0f);
    col2im_add(col, g, dxn);
    cpu::store_f32_parallel(dxn, dx + n * g.image(), g.image());
  });
}

// Each worker sums its images into a private FP32 dW (and dbias); the partial sums are then
// added in worker order, so the result is the same on every run with the same thread count.
template <class T>
void conv_backward_filter(const T* x, const T* dy, T* dw, T* dbias, const Conv2dGeometry& g) {
  const int64_t w_size = g.o * g.rows();
  const int64_t dy_size = g.o * g.pixels();
  const int threads = image_threads(g.n);
  std::vector<float> partial_w(static_cast<size_t>(threads * w_size), 0.0f);
  std::vector<float> partial_b(static_cast<size_t>(threads * g.o), 0.0f);
  for_each_image(g.n, threads, [&](int64_t n, int worker) {
    float* pw = partial_w.data() + worker * w_size;
    float* pb = partial_b.data() + worker * g.o;
    const float* dyn = output_grad_f32(dy, n, dy_size);
    float* col = cpu::scratch(kColumnSlot, g.rows() * g.pixels());
    im2col(x + n * g.image(), g, col);
    cpu::gemm_f32(false, true, g.o, g.rows(), g.pixels(), 1.0f, dyn, col, 1.0f, pw);
    if (dbias) {
      for (int64_t o = 0; o < g.o; ++o) {
        float s = 0.0f;
        for (int64_t p = 0; p < g.pixels(); ++p) s += dyn[o * g.pixels() + p];
        pb[o] += s;
      }
    }
  });
  for (int t = 1; t < threads; ++t) {
    for (int64_t i = 0; i < w_size; ++i) partial_w[i] += partial_w[t * w_size + i];
    for (int64_t o = 0; o < g.o; ++o) partial_b[o] += partial_b[t * g.o + o];
  }
  cpu::store_f32_parallel(partial_w.data(), dw, w_size);
  if (dbias) cpu::store_f32_parallel(partial_b.data(), dbias, g.o);
}

}  // namespace

void CpuBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor* bias,
                        const Conv2dDesc& desc, Tensor& y) {
  const Conv2dGeometry g = backend_checks::conv2d(kCPU, x, w, bias, desc, y);
  if (y.numel() == 0) return;
  MIXPREC_DISPATCH_FLOATING(x.dtype(), "conv2d", [&] {
    conv_forward(static_cast<const scalar_t*>(x.data()), static_cast<const scalar_t*>(w.data()),
                 bias ? static_cast<const scalar_t*>(bias->data()) : nullptr,
                 static_cast<scalar_t*>(y.data()), g);
  });
}

void CpuBackend::conv2d_backward_data(const Tensor& dy, const Tensor& w, const Conv2dDesc& desc,
                                      Tensor& dx) {
  const Conv2dGeometry g = backend_checks::conv2d_backward_data(kCPU, dy, w, desc, dx);
  if (dx.numel() == 0) return;
  MIXPREC_DISPATCH_FLOATING(dy.dtype(), "conv2d_backward_data", [&] {
    conv_backward_data(static_cast<const scalar_t*>(dy.data()),
                       static_cast<const scalar_t*>(w.data()), static_cast<scalar_t*>(dx.data()),
                       g);
  });
}

void CpuBackend::conv2d_backward_filter(const Tensor& x, const Tensor& dy, const Conv2dDesc& desc,
                                        Tensor& dw, Tensor* dbias) {
  const Conv2dGeometry g =
      backend_checks::conv2d_backward_filter(kCPU, x, dy, desc, dw, dbias);
  if (dw.numel() == 0 && (!dbias || dbias->numel() == 0)) return;
  MIXPREC_DISPATCH_FLOATING(x.dtype(), "conv2d_backward_filter", [&] {
    conv_backward_filter(static_cast<const scalar_t*>(x.data()),
                         static_cast<const scalar_t*>(dy.data()), static_cast<scalar_t*>(dw.data()),
                         dbias ? static_cast<scalar_t*>(dbias->data()) : nullptr, g);
  });
}

}  // namespace mixprec
