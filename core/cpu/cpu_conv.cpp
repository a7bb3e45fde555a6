// 2-D convolution of the CPU backend: im2col + FP32 GEMM, parallel over the batch.
//
// Per image n (K = C*KH*KW rows of the column matrix, P = OH*OW output pixels):
//   forward:         y[n] (O x P)  = W (O x K) @ col(x[n]) (K x P) + bias
//   backward data:   dx[n]         = col2im(W^T (K x O) @ dy[n] (O x P))
//   backward filter: dW (O x K)    = sum_n dy[n] @ col(x[n])^T, dbias = sum_n,p dy[n]
// Every sum is in FP32 and each output element is rounded once to the tensor's dtype.
//
// The per-image products go to the tile kernel of core/cpu/tile_gemm.h, which reads its
// left operand through strides (or per-row offsets) and its right one row by row. Stride-1
// convolutions whose output is as wide as the input never build the column matrix: they
// read it in place from shifted copies of the image (see ShiftPlan). The filter gradient's
// product sums over P, the contiguous dimension of both dy[n] and col(x[n]), so one of the
// two is transposed first: dy[n] (giving dW^T, K x O, transposed once at the end) when the
// columns are read in place or O <= K, else the column matrix.
//
// BF16 filter gradients take the dot-product kernel of core/cpu/conv_bf16_dot.h instead when
// the CPU has AVX512-BF16 and the column matrix has enough rows.
//
// 3x3 stride-1 pad-1 convolutions of enough channels take Winograd F(2x2, 3x3) forward and
// backward data instead (core/cpu/cpu_winograd.h): 16 multiplications per 2x2 output tile
// where the GEMM does 36.
#include <omp.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "core/backend_checks.h"
#include "core/cpu/bf16_dot_gemm.h"
#include "core/cpu/blocks.h"
#include "core/cpu/common.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/cpu_gemm.h"
#include "core/cpu/conv_columns.h"
#include "core/cpu/conv_bf16_dot.h"
#include "core/cpu/cpu_winograd.h"
#include "core/cpu/dispatch.h"
#include "core/cpu/simd.h"
#include "core/cpu/tile_gemm.h"
#include "core/tensor.h"

namespace mixprec {
namespace {

using backend_checks::Conv2dGeometry;
using cpu::for_each_image;
using cpu::image_threads;
using cpu::im2col;
using cpu::is_flat_shift;
using cpu::lane_sum;
using cpu::shifted_row;
using cpu::ShiftedRow;
using cpu::valid_outputs;
using cpu::ValidRange;
using cpu::zero_border_columns;

// Scratch slots (core/cpu/cpu_gemm.h) of the buffers that are live together in one kernel.
constexpr int kFilterSlot = 0;  // the calling thread only
constexpr int kColumnSlot = 1;
constexpr int kOutputSlot = 2;
constexpr int kInputSlot = 3;
// Column-matrix rows (C*KH*KW) from which a BF16 filter gradient takes the dot products.
constexpr int64_t kDotFilterMinRows = 32;

// The calling thread's scratch `slot` as the FP32 buffer of n elements of a T operand
// (core/cpu/blocks.h): none for FP32, which is used in place.
template <class T>
float* f32_scratch(int slot, int64_t n) {
  if constexpr (std::is_same_v<T, float>) return nullptr;
  else return cpu::scratch(slot, n);
}

// The adjoint of im2col: dx[c][ih][iw] = the sum of the column entries read from that cell,
// added in (i, j) order; the entries that read the padding are dropped. dx is overwritten;
// col is scratch and may be changed.
//
// For a flat-shift convolution each column matrix row adds into the plane as one contiguous
// shifted run, its padding entries zeroed first (adding +0 changes no sum, except that a -0
// sum becomes +0). Otherwise the entries are scattered row by row.
void col2im(float* col, const Conv2dGeometry& g, float* dx) {
  const int64_t pixels = g.pixels();
  std::fill(dx, dx + g.image(), 0.0f);
  if (is_flat_shift(g)) {
    std::vector<ShiftedRow> rows(static_cast<size_t>(g.kh * g.kw));
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) rows[i * g.kw + j] = shifted_row(g, i, j);
    for (int64_t c = 0; c < g.c; ++c) {
      float* plane = dx + c * g.h * g.w;
      for (int64_t t = 0; t < g.kh * g.kw; ++t) {
        const ShiftedRow& r = rows[t];
        float* row = col + (c * g.kh * g.kw + t) * pixels;
        zero_border_columns(row, g, r);
        for (int64_t f = r.first; f < r.last; ++f) plane[f + r.shift] += row[f];
      }
    }
    return;
  }
  for (int64_t c = 0; c < g.c; ++c) {
    for (int64_t i = 0; i < g.kh; ++i) {
      for (int64_t j = 0; j < g.kw; ++j) {
        const ValidRange cols = valid_outputs(j, g.ow, g.w, g.sw, g.pw);
        const int64_t first_iw = cols.begin * g.sw - g.pw + j;
        const float* row = col + ((c * g.kh + i) * g.kw + j) * pixels;
        for (int64_t oh = 0; oh < g.oh; ++oh) {
          const int64_t ih = oh * g.sh - g.ph + i;
          if (ih < 0 || ih >= g.h) continue;
          const float* in = row + oh * g.ow;
          float* out = dx + (c * g.h + ih) * g.w + first_iw;
          for (int64_t ow = cols.begin; ow < cols.end; ++ow)
            out[(ow - cols.begin) * g.sw] += in[ow];
        }
      }
    }
  }
}

// The implicit column matrix of a flat-shift convolution, as core/cpu/tile_gemm.h's
// OffsetRows. Row (ch, i, j) of the matrix is source plane ch shifted by tap (i, j): grid cell
// (r, c) reads source cell (r + dr, c + dc), or 0 where that lies outside the plane.
//   forward:       source x (C planes, H x W),   grid y (OH x W),  (dr, dc) = (i - PH, j - PW)
//   backward data: source dy (O planes, OH x W), grid dx (H x W),  (dr, dc) = (PH - i, PW - j)
// The grid and the source planes have one width W, so a shift by dr rows is a flat offset of
// dr * W. The column shift is not: it would wrap into the neighbouring row. So the image is
// copied once per kernel column j, shifted by dc with zeros filled in at the row ends, each
// plane with `top` zero rows above it and `bottom` below, where the row shifts land outside
// the plane. Every matrix row is then one contiguous run of a copy: the tile kernel reads it
// in place, with no column matrix written (a third of im2col's stores at KW = 3) and no lane
// masks (with per-row masks the kernel measured 18% slower).
struct ShiftPlan {
  int64_t channels = 0, src_rows = 0, width = 0, kw = 0;
  int64_t top = 0, bottom = 0;
  std::vector<int64_t> column_shift;  // dc per kernel column
  std::vector<int64_t> offsets;       // per matrix row (ch, i, j)
  int64_t plane() const { return (top + src_rows + bottom) * width; }
  int64_t copy() const { return channels * plane(); }
  // kw copies, then slack for the vector loads that run past the last grid cell.
  int64_t size() const { return kw * copy() + 16; }
};

ShiftPlan shift_plan(const Conv2dGeometry& g, bool backward) {
  ShiftPlan plan;
  plan.channels = backward ? g.o : g.c;
  plan.src_rows = backward ? g.oh : g.h;
  plan.width = g.w;  // == g.ow
  plan.kw = g.kw;
  const int64_t grid_rows = backward ? g.h : g.oh;
  const auto row_shift = [&](int64_t i) { return backward ? g.ph - i : i - g.ph; };
  for (int64_t i = 0; i < g.kh; ++i) {
    plan.top = std::max(plan.top, -row_shift(i));
    plan.bottom = std::max(plan.bottom, grid_rows + row_shift(i) - plan.src_rows);
  }
  for (int64_t j = 0; j < g.kw; ++j) plan.column_shift.push_back(backward ? g.pw - j : j - g.pw);
  for (int64_t ch = 0; ch < plan.channels; ++ch)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j)
        plan.offsets.push_back(j * plan.copy() + ch * plan.plane() +
                               (plan.top + row_shift(i)) * plan.width);
  return plan;
}

// The copies of one image's source planes (src: plan.channels planes of src_rows x width, in
// FP32) in the calling thread's column scratch, as the OffsetRows operand of the plan. The
// zeros (rows above and below the planes, slack) are the same for every image: `zeroed` says
// that this thread's scratch still holds them from an earlier image of the same call, so only
// the planes are written.
cpu::OffsetRows shifted_copies(const float* src, const ShiftPlan& plan, bool zeroed) {
  float* buf = cpu::scratch(kColumnSlot, plan.size());
  if (!zeroed) std::fill(buf, buf + plan.size(), 0.0f);
  const int64_t w = plan.width, body = plan.src_rows * w;
  for (int64_t j = 0; j < plan.kw; ++j) {
    const int64_t dc = plan.column_shift[j];
    // The border columns, which read outside the row: [0, -dc) or [w - dc, w).
    const int64_t border_begin = dc < 0 ? 0 : std::max<int64_t>(0, w - dc);
    const int64_t border_end = dc < 0 ? std::min(w, -dc) : w;
    // One flat shifted copy per plane (out[f] = in[f + dc]), after which the border cells,
    // which it filled from the neighbouring row, are zeroed. Its first or last |dc| cells,
    // which would read outside the plane, are border cells and are not copied at all.
    const int64_t first = std::min(std::max<int64_t>(0, -dc), body);
    const int64_t last = std::max(body - std::max<int64_t>(0, dc), first);
    for (int64_t ch = 0; ch < plan.channels; ++ch) {
      float* rows = buf + j * plan.copy() + ch * plan.plane() + plan.top * w;
      const float* in = src + ch * body;
      std::copy(in + first + dc, in + last + dc, rows + first);
      for (int64_t r = 0; r < plan.src_rows; ++r)
        for (int64_t c = border_begin; c < border_end; ++c) rows[r * w + c] = 0.0f;
    }
  }
  return {buf, plan.offsets.data()};
}

// n elements of src as FP32: src itself for F32, else widened into the thread's scratch slot.
template <class T>
const float* source_f32(const T* src, int64_t n, int slot) {
  return cpu::load_f32(src, f32_scratch<T>(slot, n), n);
}

// A flat-shift convolution reads its column matrix in place (implicit GEMM) when the AVX-512
// tile kernel runs, whose OffsetRows operand needs it; otherwise it builds the matrix.
bool implicit_columns(const Conv2dGeometry& g) {
  return is_flat_shift(g) && cpu::tile_gemm_vectorised();
}

template <class T>
void conv_forward(const T* x, const T* w, const T* bias, T* y, const Conv2dGeometry& g) {
  const int64_t w_size = g.o * g.rows();
  const float* w32 = cpu::load_f32_parallel(w, f32_scratch<T>(kFilterSlot, w_size), w_size);
  std::vector<float> bias_buf(static_cast<size_t>(bias ? g.o : 0));
  const float* bias32 = bias ? cpu::load_f32(bias, bias_buf.data(), g.o) : nullptr;
  // core/cpu/cpu_winograd.h: the whole batch at once, 16-bit images widened a group at a time.
  if (cpu::winograd_applies(g)) return cpu::winograd_conv2d(x, w32, bias32, y, g);
  const int64_t out_size = g.o * g.pixels();
  const bool implicit = implicit_columns(g);
  const ShiftPlan plan = implicit ? shift_plan(g, false) : ShiftPlan();
  const int threads = image_threads(g.n);
  std::vector<char> zeroed(static_cast<size_t>(threads), 0);  // per worker, see shifted_copies
  for_each_image(g.n, threads, [&](int64_t n, int worker) {
    float* out = cpu::f32_target(y + n * out_size, f32_scratch<T>(kOutputSlot, out_size));
    const cpu::StridedMatrix filters{w32, g.rows(), 1};
    if (implicit) {
      const float* image = source_f32(x + n * g.image(), g.image(), kInputSlot);
      const cpu::OffsetRows columns = shifted_copies(image, plan, zeroed[worker]);
      zeroed[worker] = 1;
      cpu::tile_gemm_rows_f32(g.o, g.pixels(), g.rows(), filters, columns, out, bias32);
    } else {
      float* col = cpu::scratch(kColumnSlot, g.rows() * g.pixels());
      im2col(x + n * g.image(), g, col);
      cpu::tile_gemm_f32(g.o, g.pixels(), g.rows(), filters, col, out, false, bias32);
    }
    cpu::store_f32_parallel(out, y + n * out_size, out_size);
  });
}

// dy[n] as FP32: the tensor itself for FP32, else widened into the thread's scratch.
template <class T>
const float* output_grad_f32(const T* dy, int64_t n, int64_t size) {
  return cpu::load_f32_parallel(dy + n * size, f32_scratch<T>(kOutputSlot, size), size);
}

// Backward data. With implicit columns, dx[n][c][ih][iw] = sum over (o, i, j) of
// W[o][c][i][j] * dy[n][o][ih + PH - i][iw + PW - j]: the product of W' (C x O*KH*KW, with
// W'[c][(o, i, j)] = W[o][c][i][j]) and the shifted columns of dy[n], written straight into
// dx[n]. No column matrix is written and nothing is scattered.
template <class T>
void conv_backward_data(const T* dy, const T* w, T* dx, const Conv2dGeometry& g) {
  const int64_t w_size = g.o * g.rows();
  const float* w32 = cpu::load_f32_parallel(w, f32_scratch<T>(kFilterSlot, w_size), w_size);
  // core/cpu/cpu_winograd.h: the whole batch at once, 16-bit images widened a group at a time.
  if (cpu::winograd_applies(g)) return cpu::winograd_conv2d_backward_data(dy, w32, dx, g);
  const int64_t dy_size = g.o * g.pixels();
  const bool implicit = implicit_columns(g);
  const ShiftPlan plan = implicit ? shift_plan(g, true) : ShiftPlan();
  const int64_t taps = g.kh * g.kw;
  std::vector<float> transposed(static_cast<size_t>(implicit ? w_size : 0));
  if (implicit) {
    for (int64_t o = 0; o < g.o; ++o)
      for (int64_t c = 0; c < g.c; ++c)
        std::copy(w32 + (o * g.c + c) * taps, w32 + (o * g.c + c + 1) * taps,
                  transposed.data() + (c * g.o + o) * taps);
  }
  const int threads = image_threads(g.n);
  std::vector<char> zeroed(static_cast<size_t>(threads), 0);  // per worker, see shifted_copies
  for_each_image(g.n, threads, [&](int64_t n, int worker) {
    float* dxn = cpu::f32_target(dx + n * g.image(), f32_scratch<T>(kInputSlot, g.image()));
    if (implicit) {
      const float* grad = source_f32(dy + n * dy_size, dy_size, kOutputSlot);
      const cpu::OffsetRows columns = shifted_copies(grad, plan, zeroed[worker]);
      zeroed[worker] = 1;
      cpu::tile_gemm_rows_f32(g.c, g.h * g.w, g.o * taps, {transposed.data(), g.o * taps, 1},
                              columns, dxn);
    } else {
      const float* dyn = output_grad_f32(dy, n, dy_size);
      float* col = cpu::scratch(kColumnSlot, g.rows() * g.pixels());
      // W^T read in place: element (k, o) of the K x O operand is w32[o * K + k].
      cpu::tile_gemm_f32(g.rows(), g.pixels(), g.o, {w32, 1, g.rows()}, dyn, col, false);
      col2im(col, g, dxn);
    }
    cpu::store_f32_parallel(dxn, dx + n * g.image(), g.image());
  });
}

// Each worker sums its images into a private FP32 dW (and dbias); the partial sums are then
// added in worker order, so the result is the same on every run with the same thread count.
// Without the AVX-512 tile kernel the product is Eigen's, dy[n] @ col^T as it stands.
template <class T>
void conv_backward_filter(const T* x, const T* dy, T* dw, T* dbias, const Conv2dGeometry& g) {
  if constexpr (std::is_same_v<T, bfloat16>) {
    // The dot products' tiles are K rows of the column matrix: with few (a first layer's
    // 1 x 3 x 3) most of each tile is idle. Measured for cnn_fashion's layers at batch 128:
    // at K = 9 the widened kernel 0.77 ms, the dot products 1.3; at K = 288 the widened
    // kernel 5.0 ms, the dot products 3.3.
    if (cpu::bf16_dot_available() && g.rows() >= kDotFilterMinRows)
      return cpu::conv2d_backward_filter_bf16_dot(x, dy, dw, dbias, g);
  }
  const int64_t w_size = g.o * g.rows();
  const int64_t dy_size = g.o * g.pixels();
  const int threads = image_threads(g.n);
  const bool tiled = cpu::tile_gemm_vectorised();
  // Tiled: the partials hold dW^T (K x O) when dy[n] is the operand transposed. Its column
  // matrix is then the left operand, which a flat-shift convolution reads in place from the
  // shifted copies of x[n] (the forward's implicit columns) instead of building it; that
  // beats building and transposing the column matrix even when dy[n] is the larger one
  // (measured for 3x3 on one channel into 32: 1.6 ms against 1.9 for a batch of 128 28x28).
  const bool implicit = tiled && implicit_columns(g);
  const bool transposed_w = tiled && (implicit || g.o <= g.rows());
  const ShiftPlan plan = implicit ? shift_plan(g, false) : ShiftPlan();
  std::vector<char> zeroed(static_cast<size_t>(threads), 0);  // per worker, see shifted_copies
  std::vector<float> partial_w(static_cast<size_t>(threads * w_size), 0.0f);
  std::vector<float> partial_b(static_cast<size_t>(threads * g.o), 0.0f);
  for_each_image(g.n, threads, [&](int64_t n, int worker) {
    float* pw = partial_w.data() + worker * w_size;
    float* pb = partial_b.data() + worker * g.o;
    const float* dyn = output_grad_f32(dy, n, dy_size);
    cpu::StridedMatrix columns{nullptr, g.pixels(), 1};
    if (implicit) {
      const float* image = source_f32(x + n * g.image(), g.image(), kInputSlot);
      const cpu::OffsetRows rows = shifted_copies(image, plan, zeroed[worker]);
      zeroed[worker] = 1;
      columns = {rows.base, 0, 1, rows.offsets};
    } else {
      float* col = cpu::scratch(kColumnSlot, g.rows() * g.pixels());
      im2col(x + n * g.image(), g, col);
      columns.data = col;
    }
    if (!tiled) {
      cpu::gemm_f32(false, true, g.o, g.rows(), g.pixels(), 1.0f, dyn, columns.data, 1.0f, pw);
    } else if (transposed_w) {
      float* dy_t = cpu::scratch(kInputSlot, dy_size);  // the widened x[n] is used up
      cpu::transpose_f32(dyn, g.o, g.pixels(), dy_t);
      cpu::tile_gemm_f32(g.rows(), g.o, g.pixels(), columns, dy_t, pw, true);
    } else {
      float* col_t = cpu::scratch(kInputSlot, g.rows() * g.pixels());
      cpu::transpose_f32(columns.data, g.rows(), g.pixels(), col_t);
      cpu::tile_gemm_f32(g.o, g.rows(), g.pixels(), {dyn, g.pixels(), 1}, col_t, pw, true);
    }
    if (dbias) {
      for (int64_t o = 0; o < g.o; ++o) pb[o] += lane_sum(dyn + o * g.pixels(), g.pixels());
    }
  });
  for (int t = 1; t < threads; ++t) {
    for (int64_t i = 0; i < w_size; ++i) partial_w[i] += partial_w[t * w_size + i];
    for (int64_t o = 0; o < g.o; ++o) partial_b[o] += partial_b[t * g.o + o];
  }
  if (transposed_w) {
    std::vector<float> sum_w(static_cast<size_t>(w_size));
    cpu::transpose_f32(partial_w.data(), g.rows(), g.o, sum_w.data());
    cpu::store_f32_parallel(sum_w.data(), dw, w_size);
  } else {
    cpu::store_f32_parallel(partial_w.data(), dw, w_size);
  }
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
