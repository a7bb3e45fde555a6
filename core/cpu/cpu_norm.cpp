// Layer and batch normalisation of the CPU backend. Statistics are FP32 (batch-norm channel
// sums accumulate in double: they run over N*H*W terms, often 10^5 and more); values are
// rounded once on store. Reductions over rows run in a fixed order, so results do not depend
// on the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/backend_checks.h"
#include "core/cpu/common.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/dispatch.h"
#include "core/math/norm.h"
#include "core/tensor.h"

namespace mixprec {
namespace {

using cpu::kParallelWork;
// Rows per partial sum of the layer-norm weight/bias gradients. The partials are then added
// in block order, which fixes the summation order independently of the threads.
constexpr int64_t kRowBlock = 32;

template <class T>
float load_or(const T* p, int64_t i, float fallback) {
  return p ? to_float(p[i]) : fallback;
}

template <class T>
void layer_norm_rows(const T* x, const T* w, const T* b, float eps, T* y, float* mean,
                     float* rstd, int64_t rows, int64_t cols) {
#pragma omp parallel for if (rows * cols > kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    float sum = 0.0f;
    for (int64_t j = 0; j < cols; ++j) sum += to_float(xr[j]);
    const float n = static_cast<float>(cols);
    const float m = norm_mean(sum, n);
    float sq = 0.0f;
    for (int64_t j = 0; j < cols; ++j) {
      const float d = to_float(xr[j]) - m;
      sq += d * d;
    }
    const float rs = norm_rstd(norm_variance(sq, n), eps);
    mean[r] = m;
    rstd[r] = rs;
    for (int64_t j = 0; j < cols; ++j)
      yr[j] = from_float<T>(norm_apply(to_float(xr[j]), m, rs, load_or(w, j, 1.0f),
                                       load_or(b, j, 0.0f)));
  }
}

template <class T>
void layer_norm_backward_rows(const T* x, const T* w, const float* mean, const float* rstd,
                              const T* dy, T* dx, T* dw, T* db, int64_t rows, int64_t cols) {
#pragma omp parallel for if (rows * cols > kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    const T* dyr = dy + r * cols;
    T* dxr = dx + r * cols;
    float sum_g = 0.0f, sum_g_xhat = 0.0f;
    for (int64_t j = 0; j < cols; ++j) {
      const float g = to_float(dyr[j]) * load_or(w, j, 1.0f);
      sum_g += g;
      sum_g_xhat += layer_norm_grad_xhat(g, to_float(xr[j]), mean[r], rstd[r]);
    }
    const NormBackwardMeans means =
        norm_backward_means(sum_g, sum_g_xhat, static_cast<float>(cols), true);
    for (int64_t j = 0; j < cols; ++j) {
      const float g = to_float(dyr[j]) * load_or(w, j, 1.0f);
      const float xhat = norm_xhat(to_float(xr[j]), mean[r], rstd[r]);
      dxr[j] = from_float<T>(norm_backward_value(g, xhat, means.g, means.g_xhat, rstd[r]));
    }
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
    for (int64_t r = blk * kRowBlock; r < end; ++r)
      for (int64_t j = 0; j < cols; ++j) {
        const float d = to_float(dy[r * cols + j]);
        pw[j] += layer_norm_grad_xhat(d, to_float(x[r * cols + j]), mean[r], rstd[r]);
        pb[j] += d;
      }
  }
#pragma omp parallel for if (rows * cols > kParallelWork)
  for (int64_t j = 0; j < cols; ++j) {
    float sw = 0.0f, sb = 0.0f;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      sw += partial[blk * 2 * cols + j];
      sb += partial[blk * 2 * cols + cols + j];
    }
    if (dw) dw[j] = from_float<T>(sw);
    if (db) db[j] = from_float<T>(sb);
  }
}

// Layout of an NCHW tensor seen as [N, C, inner].
struct ChannelLayout : backend_checks::Channels {
  int64_t at(int64_t sample, int64_t channel, int64_t i) const {
    return (sample * c + channel) * inner + i;
  }
};

template <class T>
void batch_norm_channels(const T* x, const T* w, const T* b, float* running_mean,
                         float* running_var, bool training, float momentum, float eps, T* y,
                         float* save_mean, float* save_invstd, const ChannelLayout& l) {
  const double count = static_cast<double>(l.count());
#pragma omp parallel for if (l.n * l.c * l.inner > kParallelWork)
  for (int64_t c = 0; c < l.c; ++c) {
    float m, invstd;
    if (training) {
      double sum = 0.0;
      for (int64_t s = 0; s < l.n; ++s)
        for (int64_t i = 0; i < l.inner; ++i) sum += to_float(x[l.at(s, c, i)]);
      const double mean = norm_mean(sum, count);
      double sq = 0.0;
      for (int64_t s = 0; s < l.n; ++s)
        for (int64_t i = 0; i < l.inner; ++i) {
          const double d = to_float(x[l.at(s, c, i)]) - mean;
          sq += d * d;
        }
      const float var = static_cast<float>(norm_variance(sq, count));
      m = static_cast<float>(mean);
      invstd = norm_rstd(var, eps);
      running_mean[c] = running_stat_update(running_mean[c], m, momentum);
      running_var[c] = running_stat_update(running_var[c], unbiased_variance(var, count), momentum);
    } else {
      m = running_mean[c];
      invstd = norm_rstd(running_var[c], eps);
    }
    save_mean[c] = m;
    save_invstd[c] = invstd;
    const float wc = to_float(w[c]), bc = to_float(b[c]);
    for (int64_t s = 0; s < l.n; ++s)
      for (int64_t i = 0; i < l.inner; ++i) {
        const int64_t k = l.at(s, c, i);
        y[k] = from_float<T>(norm_apply(to_float(x[k]), m, invstd, wc, bc));
      }
  }
}

template <class T>
void batch_norm_backward_channels(const T* x, const T* w, const float* save_mean,
                                  const float* save_invstd, const T* dy, bool training, T* dx,
                                  T* dw, T* db, const ChannelLayout& l) {
  const double count = static_cast<double>(l.count());
#pragma omp parallel for if (l.n * l.c * l.inner > kParallelWork)
  for (int64_t c = 0; c < l.c; ++c) {
    const float m = save_mean[c], invstd = save_invstd[c];
    double sum_dy = 0.0, sum_dy_xhat = 0.0;
    for (int64_t s = 0; s < l.n; ++s)
      for (int64_t i = 0; i < l.inner; ++i) {
        const int64_t k = l.at(s, c, i);
        const float d = to_float(dy[k]);
        sum_dy += d;
        sum_dy_xhat += static_cast<double>(d) * norm_xhat(to_float(x[k]), m, invstd);
      }
    dw[c] = from_float<T>(static_cast<float>(sum_dy_xhat));
    db[c] = from_float<T>(static_cast<float>(sum_dy));
    const float scale = to_float(w[c]) * invstd;
    const NormBackwardMeans means = norm_backward_means(sum_dy, sum_dy_xhat, count, training);
    for (int64_t s = 0; s < l.n; ++s)
      for (int64_t i = 0; i < l.inner; ++i) {
        const int64_t k = l.at(s, c, i);
        const float xhat = norm_xhat(to_float(x[k]), m, invstd);
        dx[k] = from_float<T>(
            norm_backward_value(to_float(dy[k]), xhat, means.g, means.g_xhat, scale));
      }
  }
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
                            float momentum, float eps, Tensor& y, Tensor& save_mean,
                            Tensor& save_invstd) {
  const ChannelLayout l{backend_checks::batch_norm(kCPU, x, weight, bias, running_mean, running_var,
                                                    training, y, save_mean, save_invstd)};
  MIXPREC_DISPATCH_FLOATING(x.dtype(), "batch_norm", [&] {
    batch_norm_channels(static_cast<const scalar_t*>(x.data()),
                        static_cast<const scalar_t*>(weight.data()),
                        static_cast<const scalar_t*>(bias.data()), running_mean.data_as<float>(),
                        running_var.data_as<float>(), training, momentum, eps,
                        static_cast<scalar_t*>(y.data()), save_mean.data_as<float>(),
                        save_invstd.data_as<float>(), l);
  });
}

void CpuBackend::batch_norm_backward(const Tensor& x, const Tensor& weight,
                                     const Tensor& save_mean, const Tensor& save_invstd,
                                     const Tensor& dy, bool training, Tensor& dx,
                                     Tensor& dweight, Tensor& dbias) {
  const ChannelLayout l{backend_checks::batch_norm_backward(kCPU, x, weight, save_mean, save_invstd,
                                                             dy, dx, dweight, dbias)};
  MIXPREC_DISPATCH_FLOATING(x.dtype(), "batch_norm_backward", [&] {
    batch_norm_backward_channels(
        static_cast<const scalar_t*>(x.data()), static_cast<const scalar_t*>(weight.data()),
        save_mean.data_as<float>(), save_invstd.data_as<float>(),
        static_cast<const scalar_t*>(dy.data()), training, static_cast<scalar_t*>(dx.data()),
        static_cast<scalar_t*>(dweight.data()), static_cast<scalar_t*>(dbias.data()), l);
  });
}

}  // namespace mixprec
