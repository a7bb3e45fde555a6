// Layer and batch normalisation of the CPU backend. Statistics are FP32 (batch-norm channel
// sums accumulate in double: they run over N*H*W terms, often 10^5 and more); values are
// rounded once on store. Reductions over rows run in a fixed order, so results do not depend
// on the thread count.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/backend_checks.h"
#include "core/cpu/blocks.h"
#include "core/cpu/common.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/dispatch.h"
#include "core/cpu/simd.h"
#include "core/math/elementwise.h"
#include "core/math/norm.h"
#include "core/tensor.h"

namespace mixprec {
namespace {

using cpu::kParallelWork;
// Rows per partial sum of the layer-norm weight/bias gradients. The partials are then added
// in block order, which fixes the summation order independently of the threads.
constexpr int64_t kRowBlock = 32;

// A layer-norm weight or bias widened once per call, or `fallback` (1 or 0) per column when
// there is none.
template <class T>
std::vector<float> widened_or(const T* p, int64_t cols, float fallback) {
  if (!p) return std::vector<float>(static_cast<size_t>(cols), fallback);
  std::vector<float> out(static_cast<size_t>(cols));
  const float* values = cpu::load_f32(p, out.data(), cols);  // F32: p itself
  if (values != out.data()) std::copy(values, values + cols, out.data());
  return out;
}

// The 16-bit rows are widened into FP32 buffers and the results rounded from one with the bulk
// converters (core/cpu/blocks.h): the same values as a conversion per element, without the
// scalar conversions' cost, so every dtype's results are those of the FP32 loops on the
// widened values. A row's sums are FP32 in cpu::kLanes lanes (core/cpu/simd.h), their order
// fixed by the row length: vector loops instead of one chain of dependent adds per sum.

// The sums of x[j] and, given the mean, of (x[j] - mean)^2 over a row.
float row_sum(const float* x, int64_t cols) {
  cpu::Floats8 lanes = {};
  int64_t k = 0;
  for (; k + cpu::kLanes <= cols; k += cpu::kLanes) {
    cpu::Floats8 f;
    cpu::load8(x + k, f);
    lanes += f;
  }
  for (; k < cols; ++k) lanes[k % cpu::kLanes] += x[k];
  return cpu::lane_total(lanes);
}

float row_squares_about(const float* x, float mean, int64_t cols) {
  cpu::Floats8 lanes = {};
  int64_t k = 0;
  for (; k + cpu::kLanes <= cols; k += cpu::kLanes) {
    cpu::Floats8 f;
    cpu::load8(x + k, f);
    f -= mean;
    lanes += f * f;
  }
  for (; k < cols; ++k) {
    const float d = x[k] - mean;
    lanes[k % cpu::kLanes] += d * d;
  }
  return cpu::lane_total(lanes);
}

// Layer norm's backward sums over a row, of g = dy * weight and of g * xhat.
struct RowGradSums {
  float g, g_xhat;
};

RowGradSums row_grad_sums(const float* x, const float* dy, const float* weight, float mean,
                          float rstd, int64_t cols) {
  cpu::Floats8 lanes_g = {}, lanes_g_xhat = {};
  int64_t k = 0;
  for (; k + cpu::kLanes <= cols; k += cpu::kLanes) {
    cpu::Floats8 xv, dv, wv;
    cpu::load8(x + k, xv);
    cpu::load8(dy + k, dv);
    cpu::load8(weight + k, wv);
    const cpu::Floats8 g = dv * wv;
    lanes_g += g;
    lanes_g_xhat += g * (xv - mean) * rstd;  // layer_norm_grad_xhat's order
  }
  for (; k < cols; ++k) {
    const float g = dy[k] * weight[k];
    lanes_g[k % cpu::kLanes] += g;
    lanes_g_xhat[k % cpu::kLanes] += layer_norm_grad_xhat(g, x[k], mean, rstd);
  }
  return {cpu::lane_total(lanes_g), cpu::lane_total(lanes_g_xhat)};
}
template <class T>
void layer_norm_rows(const T* x, const T* w, const T* b, float eps, T* y, float* mean,
                     float* rstd, int64_t rows, int64_t cols) {
  const std::vector<float> weight = widened_or(w, cols, 1.0f), bias = widened_or(b, cols, 0.0f);
#pragma omp parallel for if (rows * cols > kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = cpu::load_f32(x + r * cols, cpu::row_buffer(0, cols), cols);
    const float n = static_cast<float>(cols);
    const float m = norm_mean(row_sum(xr, cols), n);
    const float rs = norm_rstd(norm_variance(row_squares_about(xr, m, cols), n), eps);
    mean[r] = m;
    rstd[r] = rs;
    float* yr = cpu::f32_target(y + r * cols, cpu::row_buffer(1, cols));
    for (int64_t j = 0; j < cols; ++j) yr[j] = norm_apply(xr[j], m, rs, weight[j], bias[j]);
    cpu::store_f32(yr, y + r * cols, cols);
  }
}

template <class T>
void layer_norm_backward_rows(const T* x, const T* w, const float* mean, const float* rstd,
                              const T* dy, T* dx, T* dw, T* db, int64_t rows, int64_t cols) {
  const std::vector<float> weight = widened_or(w, cols, 1.0f);
#pragma omp parallel for if (rows * cols > kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = cpu::load_f32(x + r * cols, cpu::row_buffer(0, cols), cols);
    const float* dyr = cpu::load_f32(dy + r * cols, cpu::row_buffer(1, cols), cols);
    const RowGradSums sums = row_grad_sums(xr, dyr, weight.data(), mean[r], rstd[r], cols);
    const NormBackwardMeans means =
        norm_backward_means(sums.g, sums.g_xhat, static_cast<float>(cols), true);
    float* dxr = cpu::f32_target(dx + r * cols, cpu::row_buffer(2, cols));
    for (int64_t j = 0; j < cols; ++j) {
      const float g = dyr[j] * weight[j];
      const float xhat = norm_xhat(xr[j], mean[r], rstd[r]);
      dxr[j] = norm_backward_value(g, xhat, means.g, means.g_xhat, rstd[r]);
    }
    cpu::store_f32(dxr, dx + r * cols, cols);
  }
  if (!dw && !db) return;

  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  // partial[blk][0][j]: sum of dy * xhat; partial[blk][1][j]: sum of dy.
  std::vector<float> partial(static_cast<size_t>(blocks * 2 * cols), 0.0f);
#pragma omp parallel for if (rows * cols > kParallelWork)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    float* pw = partial.data() + blk * 2 * cols;
    float* pb = pw + cols;
    const int64_t end = std::min(rows, (blk + 1) * kRowBlock);
    for (int64_t r = blk * kRowBlock; r < end; ++r) {
      const float* xr = cpu::load_f32(x + r * cols, cpu::row_buffer(0, cols), cols);
      const float* dyr = cpu::load_f32(dy + r * cols, cpu::row_buffer(1, cols), cols);
      for (int64_t j = 0; j < cols; ++j) {
        pw[j] += layer_norm_grad_xhat(dyr[j], xr[j], mean[r], rstd[r]);
        pb[j] += dyr[j];
      }
    }
  }
  std::vector<float> sums(static_cast<size_t>(2 * cols));
#pragma omp parallel for if (rows * cols > kParallelWork)
  for (int64_t j = 0; j < cols; ++j) {
    float sw = 0.0f, sb = 0.0f;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      sw += partial[blk * 2 * cols + j];
      sb += partial[blk * 2 * cols + cols + j];
    }
    sums[j] = sw;
    sums[cols + j] = sb;
  }
  if (dw) cpu::store_f32(sums.data(), dw, cols);
  if (db) cpu::store_f32(sums.data() + cols, db, cols);
}

// Layout of an NCHW tensor seen as [N, C, inner].
struct ChannelLayout : backend_checks::Channels {
  int64_t at(int64_t sample, int64_t channel, int64_t i) const {
    return (sample * c + channel) * inner + i;
  }
  int64_t planes() const { return n * c; }
};

// Batch norm gives each thread a range of channels, which it walks in memory order, sample by
// sample, through its channels' planes (one sample's `inner` values of one channel) with an
// accumulator per channel. A thread then needs no other thread's sums, so a call has a single
// parallel region and barrier; and a walk channel by channel instead would jump between
// short planes a whole sample apart, which the hardware prefetchers follow badly (measured
// twice as slow for 28x28 planes).
//
// The channel sums are in double, kept in cpu::kLanes lanes (core/cpu/simd.h): value k of a
// plane goes to lane k mod kLanes, planes are added in sample order and the lanes in lane
// order at the end. The order of every sum is fixed by the shape alone, whatever the thread
// count.
using cpu::Doubles8;
// Values per FP32 block when 16-bit planes are widened on the fly (a multiple of kLanes, so
// that the blocks of a plane keep its lanes).
constexpr int64_t kNormBlock = 1024;

// Calls body(c0, c1) once on each thread of a team, with the thread's channels [c0, c1).
template <class Body>
void for_each_channel_range(const ChannelLayout& l, const Body& body) {
#pragma omp parallel if (l.planes() * l.inner > kParallelWork && l.c > 1)
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t c0 = l.c * t / threads, c1 = l.c * (t + 1) / threads;
    if (c0 < c1) body(c0, c1);
  }
}

// Calls f(values, offset, len) over plane p's values as FP32 blocks in order; offset is the
// element offset of values[0] in the tensor, so outputs can be written at the same offsets.
template <class T, class F>
void for_each_plane_block(const T* x, int64_t p, const ChannelLayout& l, const F& f) {
  float buf[kNormBlock];
  const int64_t base = p * l.inner;
  for (int64_t i = 0; i < l.inner; i += kNormBlock) {
    const int64_t len = std::min(kNormBlock, l.inner - i);
    f(cpu::load_f32(x + base + i, buf, len), base + i, len);
  }
}

// Calls f(c, values, offset, len) for the blocks of every plane of channels [c0, c1), in
// memory order.
template <class T, class F>
void for_each_channel_block(const T* x, const ChannelLayout& l, int64_t c0, int64_t c1,
                            const F& f) {
  for (int64_t s = 0; s < l.n; ++s)
    for (int64_t c = c0; c < c1; ++c)
      for_each_plane_block(x, s * l.c + c, l,
                           [&](const float* v, int64_t offset, int64_t len) { f(c, v, offset, len); });
}

// sum lane k mod kLanes += d and sq lane k mod kLanes += d * d for d = v[k] - shift, k in
// [0, len), in double. The lanes are copied into locals for the loop: two Doubles8 references
// might alias each other, so updated through them they would make a round trip through memory
// on every step.
void add_shifted_moments(const float* v, int64_t len, double shift, Doubles8& sum,
                         Doubles8& sq) {
  Doubles8 lanes_sum = sum, lanes_sq = sq;
  int64_t k = 0;
  for (; k + cpu::kLanes <= len; k += cpu::kLanes) {
    cpu::Floats8 f;
    cpu::load8(v + k, f);
    Doubles8 d;
    cpu::widen8(f, d);
    d -= shift;
    lanes_sum += d;
    lanes_sq += d * d;
  }
  for (; k < len; ++k) {
    const double d = v[k] - shift;
    lanes_sum[k % cpu::kLanes] += d;
    lanes_sq[k % cpu::kLanes] += d * d;
  }
  sum = lanes_sum;
  sq = lanes_sq;
}

template <class T>
void batch_norm_channels(const T* x, const T* w, const T* b, float* running_mean,
                         float* running_var, bool training, float momentum, float eps, bool relu,
                         T* y, float* save_mean, float* save_invstd, const ChannelLayout& l) {
  const double count = static_cast<double>(l.count());
  for_each_channel_range(l, [&](int64_t c0, int64_t c1) {
    if (training) {
      // One pass for both statistics: the sums of d = x - shift and of d^2 in double, the
      // shift being the channel's first value, so that the mean of d is within a few standard
      // deviations of 0 and shifted_variance() cancels no more than the second pass over
      // x - mean that it replaces (core/math/norm.h); one read of x fewer.
      std::vector<double> shift(static_cast<size_t>(c1 - c0));
      for (int64_t c = c0; c < c1; ++c) shift[c - c0] = to_float(x[l.at(0, c, 0)]);
      std::vector<Doubles8> sum(shift.size(), Doubles8{}), sq(shift.size(), Doubles8{});
      for_each_channel_block(x, l, c0, c1, [&](int64_t c, const float* v, int64_t, int64_t len) {
        add_shifted_moments(v, len, shift[c - c0], sum[c - c0], sq[c - c0]);
      });
      for (int64_t c = c0; c < c1; ++c) {
        const double sum_d = cpu::lane_total(sum[c - c0]);
        const float var = static_cast<float>(
            shifted_variance(sum_d, cpu::lane_total(sq[c - c0]), count));
        save_mean[c] = static_cast<float>(shift[c - c0] + norm_mean(sum_d, count));
        save_invstd[c] = norm_rstd(var, eps);
        running_mean[c] = running_stat_update(running_mean[c], save_mean[c], momentum);
        running_var[c] =
            running_stat_update(running_var[c], unbiased_variance(var, count), momentum);
      }
    } else {
      for (int64_t c = c0; c < c1; ++c) {
        save_mean[c] = running_mean[c];
        save_invstd[c] = norm_rstd(running_var[c], eps);
      }
    }
    for_each_channel_block(x, l, c0, c1, [&](int64_t c, const float* v, int64_t offset, int64_t len) {
      const float m = save_mean[c], invstd = save_invstd[c];
      const float wc = to_float(w[c]), bc = to_float(b[c]);
      float buf[kNormBlock];
      float* o = cpu::f32_target(y + offset, buf);
      for (int64_t i = 0; i < len; ++i) o[i] = norm_apply(v[i], m, invstd, wc, bc);
      // relu of the FP32 value before the one rounding on store: the same bits as relu of
      // the stored value, since rounding keeps the sign and relu leaves the rest exact.
      if (relu) {
        for (int64_t i = 0; i < len; ++i) o[i] = unary_value<UnaryOp::Relu>(o[i]);
      }
      cpu::store_f32(o, y + offset, len);
    });
  });
}

// The largest FP32 value that rounds to zero in T (round to nearest even): half the smallest
// positive subnormal, a tie that goes to the even zero. Above it a value rounds to a positive
// one; at or below it (or negative) to a zero or a negative value.
template <class T>
constexpr float rounds_to_zero_up_to() {
  if constexpr (std::is_same_v<T, half>) return 0x1p-25f;
  else if constexpr (std::is_same_v<T, bfloat16>) return 0x1p-134f;
  else return 0.0f;
}

// For batch norm fused with relu: out = dy through relu's derivative at the batch-norm
// output, recomputed from the block's x values v as the forward computed and stored it. relu
// passes dy where the stored output is positive or NaN, and the stored output is positive
// exactly where the FP32 one is above rounds_to_zero_up_to<T>(), so the rounding itself is
// never done. (Under denormals-are-zero, which mixprec never sets, BF16's threshold would
// read as zero.)
template <class T>
const float* relu_gated(const float* dy, const float* v, int64_t len, float mean, float invstd,
                        float weight, float bias, float* out) {
  constexpr float kZeroUpTo = rounds_to_zero_up_to<T>();
  for (int64_t i = 0; i < len; ++i) {
    const float y = norm_apply(v[i], mean, invstd, weight, bias);
    out[i] = y > kZeroUpTo || y != y ? dy[i] : 0.0f;
  }
  return out;
}

// sum lane k mod kLanes += d[k] and sum_xhat lane k mod kLanes += d[k] * xhat[k] for k in
// [0, len), in double, xhat = (v - mean) * invstd in float as norm_xhat computes it. Locals
// during the loop, as in add_shifted_moments.
void add_backward_sums(const float* d, const float* v, int64_t len, float mean, float invstd,
                       Doubles8& sum, Doubles8& sum_xhat) {
  Doubles8 lanes = sum, lanes_xhat = sum_xhat;
  int64_t k = 0;
  for (; k + cpu::kLanes <= len; k += cpu::kLanes) {
    cpu::Floats8 xv, dv;
    cpu::load8(v + k, xv);
    cpu::load8(d + k, dv);
    const cpu::Floats8 xhat = (xv - mean) * invstd;
    Doubles8 dd, xd;
    cpu::widen8(dv, dd);
    cpu::widen8(xhat, xd);
    lanes += dd;
    lanes_xhat += dd * xd;
  }
  for (; k < len; ++k) {
    lanes[k % cpu::kLanes] += static_cast<double>(d[k]);
    lanes_xhat[k % cpu::kLanes] += static_cast<double>(d[k]) * norm_xhat(v[k], mean, invstd);
  }
  sum = lanes;
  sum_xhat = lanes_xhat;
}

// relu_bias: the fused relu's bias, or null without one.
template <class T>
void batch_norm_backward_channels(const T* x, const T* w, const float* save_mean,
                                  const float* save_invstd, const T* dy, bool training,
                                  const T* relu_bias, T* dx, T* dw, T* db,
                                  const ChannelLayout& l) {
  const double count = static_cast<double>(l.count());
  for_each_channel_range(l, [&](int64_t c0, int64_t c1) {
    // sums[c - c0]: lanes of dy; sums_xhat[c - c0]: lanes of dy * xhat.
    std::vector<Doubles8> sums(static_cast<size_t>(c1 - c0), Doubles8{});
    std::vector<Doubles8> sums_xhat(sums.size(), Doubles8{});
    for_each_channel_block(x, l, c0, c1, [&](int64_t c, const float* v, int64_t offset, int64_t len) {
      const float m = save_mean[c], invstd = save_invstd[c];
      float dy_buf[kNormBlock], gated_buf[kNormBlock];
      const float* d = cpu::load_f32(dy + offset, dy_buf, len);
      if (relu_bias) {
        d = relu_gated<T>(d, v, len, m, invstd, to_float(w[c]), to_float(relu_bias[c]),
                          gated_buf);
      }
      add_backward_sums(d, v, len, m, invstd, sums[c - c0], sums_xhat[c - c0]);
    });
    std::vector<NormBackwardMeans> means(sums.size());
    std::vector<float> scale(sums.size());
    for (int64_t c = c0; c < c1; ++c) {
      const double sum_dy = cpu::lane_total(sums[c - c0]);
      const double sum_dy_xhat = cpu::lane_total(sums_xhat[c - c0]);
      dw[c] = from_float<T>(static_cast<float>(sum_dy_xhat));
      db[c] = from_float<T>(static_cast<float>(sum_dy));
      scale[c - c0] = to_float(w[c]) * save_invstd[c];
      means[c - c0] = norm_backward_means(sum_dy, sum_dy_xhat, count, training);
    }
    for_each_channel_block(x, l, c0, c1, [&](int64_t c, const float* v, int64_t offset, int64_t len) {
      const float m = save_mean[c], invstd = save_invstd[c];
      const NormBackwardMeans mc = means[c - c0];
      const float sc = scale[c - c0];
      float dy_buf[kNormBlock], gated_buf[kNormBlock], out_buf[kNormBlock];
      const float* d = cpu::load_f32(dy + offset, dy_buf, len);
      if (relu_bias) {
        d = relu_gated<T>(d, v, len, m, invstd, to_float(w[c]), to_float(relu_bias[c]),
                          gated_buf);
      }
      float* o = cpu::f32_target(dx + offset, out_buf);
      for (int64_t i = 0; i < len; ++i) {
        const float xhat = norm_xhat(v[i], m, invstd);
        o[i] = norm_backward_value(d[i], xhat, mc.g, mc.g_xhat, sc);
      }
      cpu::store_f32(o, dx + offset, len);
    });
  });
}

template <class T>
const T* data_or_null(const Tensor* t) {
  return t ? static_cast<const T*>(t->data()) : nullptr;
}

template <class T>
T* data_or_null(Tensor* t) {
  return t ? static_cast<T*>(t->data()) : nullptr;
}

}  // namespace

void CpuBackend::layer_norm(const Tensor& x, const Tensor* weight, const Tensor* bias, float eps,
                            Tensor& y, Tensor& mean, Tensor& rstd) {
  const backend_checks::Rows dims =
      backend_checks::layer_norm(kCPU, x, weight, bias, y, mean, rstd);
  const int64_t rows = dims.rows, cols = dims.cols;
  if (rows == 0) return;
  MIXPREC_DISPATCH_FLOATING(x.dtype(), "layer_norm", [&] {
    layer_norm_rows(static_cast<const scalar_t*>(x.data()), data_or_null<scalar_t>(weight),
                    data_or_null<scalar_t>(bias), eps, static_cast<scalar_t*>(y.data()),
                    mean.data_as<float>(), rstd.data_as<float>(), rows, cols);
  });
}

void CpuBackend::layer_norm_backward(const Tensor& x, const Tensor* weight, const Tensor& mean,
                                     const Tensor& rstd, const Tensor& dy, Tensor& dx,
                                     Tensor* dweight, Tensor* dbias) {
  const backend_checks::Rows dims =
      backend_checks::layer_norm_backward(kCPU, x, weight, mean, rstd, dy, dx, dweight, dbias);
  const int64_t rows = dims.rows, cols = dims.cols;
  if (rows == 0) {
    if (dweight) fill(*dweight, 0.0);
    if (dbias) fill(*dbias, 0.0);
    return;
  }
  MIXPREC_DISPATCH_FLOATING(x.dtype(), "layer_norm_backward", [&] {
    layer_norm_backward_rows(static_cast<const scalar_t*>(x.data()),
                             data_or_null<scalar_t>(weight), mean.data_as<float>(),
                             rstd.data_as<float>(), static_cast<const scalar_t*>(dy.data()),
                             static_cast<scalar_t*>(dx.data()), data_or_null<scalar_t>(dweight),
                             data_or_null<scalar_t>(dbias), rows, cols);
  });
}

void CpuBackend::batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                            Tensor& running_mean, Tensor& running_var, bool training,
                            float momentum, float eps, bool relu, Tensor& y, Tensor& save_mean,
                            Tensor& save_invstd) {
  const ChannelLayout l{backend_checks::batch_norm(kCPU, x, weight, bias, running_mean, running_var,
                                                    training, y, save_mean, save_invstd)};
  MIXPREC_DISPATCH_FLOATING(x.dtype(), "batch_norm", [&] {
    batch_norm_channels(static_cast<const scalar_t*>(x.data()),
                        static_cast<const scalar_t*>(weight.data()),
                        static_cast<const scalar_t*>(bias.data()), running_mean.data_as<float>(),
                        running_var.data_as<float>(), training, momentum, eps, relu,
                        static_cast<scalar_t*>(y.data()), save_mean.data_as<float>(),
                        save_invstd.data_as<float>(), l);
  });
}

void CpuBackend::batch_norm_backward(const Tensor& x, const Tensor& weight,
                                     const Tensor& save_mean, const Tensor& save_invstd,
                                     const Tensor& dy, bool training, const Tensor* relu_bias,
                                     Tensor& dx, Tensor& dweight, Tensor& dbias) {
  const ChannelLayout l{backend_checks::batch_norm_backward(
      kCPU, x, weight, save_mean, save_invstd, dy, relu_bias, dx, dweight, dbias)};
  MIXPREC_DISPATCH_FLOATING(x.dtype(), "batch_norm_backward", [&] {
    batch_norm_backward_channels(
        static_cast<const scalar_t*>(x.data()), static_cast<const scalar_t*>(weight.data()),
        save_mean.data_as<float>(), save_invstd.data_as<float>(),
        static_cast<const scalar_t*>(dy.data()), training, data_or_null<scalar_t>(relu_bias),
        static_cast<scalar_t*>(dx.data()),
        static_cast<scalar_t*>(dweight.data()), static_cast<scalar_t*>(dbias.data()), l);
  });
}

}  // namespace mixprec
