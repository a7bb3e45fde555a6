// Softmax, log-softmax and cross-entropy of the CPU backend: one row per iteration of the
// outer (parallel) loop, FP32 math, one rounding on store.
#include <cmath>
#include <limits>
#include <vector>

#include "core/backend_checks.h"
#include "core/cpu/common.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/dispatch.h"
#include "core/math/dropout.h"
#include "core/math/softmax.h"
#include "core/tensor.h"

namespace mixprec {
namespace {

using cpu::kParallelWork;

// The maximum of a row and the sum of exp(x_j - max) over it.
struct RowMaxSum {
  float max;
  float sum;
};

// The sums of a row accumulate in double: a float running sum over a 50k-entry vocabulary
// loses digits in proportion to the row length, which the result would carry. value(j) is the
// row's element j as a float.
template <class Value>
RowMaxSum reduce_row_of(const Value& value, int64_t cols) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < cols; ++j) m = softmax_max_step(m, value(j));
  double s = 0.0;
  for (int64_t j = 0; j < cols; ++j) s += softmax_exp(value(j), m);
  return {m, static_cast<float>(s)};
}

template <class T>
RowMaxSum reduce_row(const T* x, int64_t cols) {
  return reduce_row_of([x](int64_t j) { return to_float(x[j]); }, cols);
}

template <class T>
void softmax_rows(const T* x, T* y, int64_t rows, int64_t cols, bool log) {
#pragma omp parallel for if (rows * cols > kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    const RowMaxSum st = reduce_row(xr, cols);
    if (log) {
      const float log_sum = std::log(st.sum);
      for (int64_t j = 0; j < cols; ++j)
        yr[j] = from_float<T>(log_softmax_value(to_float(xr[j]), st.max, log_sum));
    } else {
      const float inv_sum = 1.0f / st.sum;
      for (int64_t j = 0; j < cols; ++j)
        yr[j] = from_float<T>(softmax_value(to_float(xr[j]), st.max, inv_sum));
    }
  }
}

template <class T>
void softmax_backward_rows(const T* y, const T* dy, T* dx, int64_t rows, int64_t cols,
                           bool log) {
#pragma omp parallel for if (rows * cols > kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const T* yr = y + r * cols;
    const T* dyr = dy + r * cols;
    T* dxr = dx + r * cols;
    double dot = 0.0;
    for (int64_t j = 0; j < cols; ++j)
      dot += softmax_backward_term(to_float(yr[j]), to_float(dyr[j]), log);
    const float row_dot = static_cast<float>(dot);
    for (int64_t j = 0; j < cols; ++j)
      dxr[j] = from_float<T>(softmax_backward_value(to_float(yr[j]), to_float(dyr[j]), row_dot, log));
  }
}

// attention_softmax over `rows` rows of `cols` F32 scores, row r being row r % matrix_rows of
// its [matrix_rows, cols] matrix: the causal mask's -inf stands in for every element right of
// the diagonal, so the row's reduction and values are those of causal_mask then softmax.
template <class T>
void attention_softmax_rows(const float* scores, float p, PhiloxKey key, float* probs,
                            T* operand, int64_t rows, int64_t matrix_rows, int64_t cols) {
  const float drop_scale = dropout_scale(p);
#pragma omp parallel for if (rows * cols > kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const float* sr = scores + r * cols;
    const int64_t diagonal = r % matrix_rows;
    const auto masked = [&](int64_t j) {
      return j > diagonal ? -std::numeric_limits<float>::infinity() : sr[j];
    };
    const RowMaxSum st = reduce_row_of(masked, cols);
    const float inv_sum = 1.0f / st.sum;
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t i = r * cols + j;
      const float y = softmax_value(masked(j), st.max, inv_sum);
      probs[i] = y;
      operand[i] = from_float<T>(
          p > 0.0f ? dropout_value(y, dropout_keep(key.seed, key.offset + i, p), drop_scale) : y);
    }
  }
}

// attention_softmax_backward over `rows` rows: softmax_backward_rows with dy the dropped-out
// dprobs, formed as each element is read.
template <class T>
void attention_softmax_backward_rows(const float* probs, const float* dprobs, float p,
                                     PhiloxKey key, T* ds, int64_t rows, int64_t cols) {
  const float drop_scale = dropout_scale(p);
#pragma omp parallel for if (rows * cols > kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const auto dy = [&](int64_t j) {
      const int64_t i = r * cols + j;
      return p > 0.0f ? dropout_value(dprobs[i], dropout_keep(key.seed, key.offset + i, p),
                                      drop_scale)
                      : dprobs[i];
    };
    const float* yr = probs + r * cols;
    double dot = 0.0;
    for (int64_t j = 0; j < cols; ++j) dot += softmax_backward_term(yr[j], dy(j), false);
    const float row_dot = static_cast<float>(dot);
    for (int64_t j = 0; j < cols; ++j)
      ds[r * cols + j] = from_float<T>(softmax_backward_value(yr[j], dy(j), row_dot, false));
  }
}

// Fills row_stats[r] = (m, log s) and returns the mean over rows of the row losses. The mean
// is summed serially in row order so that the loss does not depend on the thread count.
template <class T>
float cross_entropy_rows(const T* logits, const int32_t* labels, float* row_stats,
                         int64_t rows, int64_t cols) {
#pragma omp parallel for if (rows * cols > kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const RowMaxSum st = reduce_row(logits + r * cols, cols);
    row_stats[2 * r] = st.max;
    row_stats[2 * r + 1] = std::log(st.sum);
  }
  double total = 0.0;
  for (int64_t r = 0; r < rows; ++r)
    total += cross_entropy_row_loss(row_stats[2 * r], row_stats[2 * r + 1],
                                    to_float(logits[r * cols + labels[r]]));
  return cross_entropy_mean(total, rows);
}

template <class T>
void cross_entropy_backward_rows(const T* logits, const int32_t* labels,
                                 const float* row_stats, float scale, T* dlogits, int64_t rows,
                                 int64_t cols) {
#pragma omp parallel for if (rows * cols > kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = logits + r * cols;
    T* dr = dlogits + r * cols;
    const float row_max = row_stats[2 * r], log_sum = row_stats[2 * r + 1];
    for (int64_t j = 0; j < cols; ++j)
      dr[j] = from_float<T>(
          cross_entropy_grad_value(to_float(xr[j]), row_max, log_sum, j == labels[r], scale));
  }
}

}  // namespace

void CpuBackend::softmax(const Tensor& x, Tensor& y, bool log) {
  const backend_checks::Rows dims = backend_checks::softmax(kCPU, x, y);
  const int64_t rows = dims.rows, cols = dims.cols;
  if (rows == 0) return;
  MIXPREC_DISPATCH_FLOATING(x.dtype(), "softmax", [&] {
    softmax_rows(static_cast<const scalar_t*>(x.data()), static_cast<scalar_t*>(y.data()), rows,
                 cols, log);
  });
}

void CpuBackend::softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx, bool log) {
  const backend_checks::Rows dims = backend_checks::softmax_backward(kCPU, y, dy, dx);
  const int64_t rows = dims.rows, cols = dims.cols;
  if (rows == 0) return;
  MIXPREC_DISPATCH_FLOATING(y.dtype(), "softmax_backward", [&] {
    softmax_backward_rows(static_cast<const scalar_t*>(y.data()),
                          static_cast<const scalar_t*>(dy.data()),
                          static_cast<scalar_t*>(dx.data()), rows, cols, log);
  });
}

void CpuBackend::attention_softmax(const Tensor& scores, float p, PhiloxKey key, Tensor& probs,
                                   Tensor& operand) {
  const backend_checks::Rows dims =
      backend_checks::attention_softmax(kCPU, scores, p, probs, operand);
  if (scores.numel() == 0) return;
  MIXPREC_DISPATCH_FLOATING(operand.dtype(), "attention_softmax", [&] {
    attention_softmax_rows(scores.data_as<float>(), p, key, probs.data_as<float>(),
                           static_cast<scalar_t*>(operand.data()), scores.numel() / dims.cols,
                           dims.rows, dims.cols);
  });
}

void CpuBackend::attention_softmax_backward(const Tensor& probs, const Tensor& dprobs, float p,
                                            PhiloxKey key, Tensor& ds) {
  const backend_checks::Rows dims =
      backend_checks::attention_softmax_backward(kCPU, probs, dprobs, p, ds);
  if (dims.rows == 0) return;
  MIXPREC_DISPATCH_FLOATING(ds.dtype(), "attention_softmax_backward", [&] {
    attention_softmax_backward_rows(probs.data_as<float>(), dprobs.data_as<float>(), p, key,
                                    static_cast<scalar_t*>(ds.data()), dims.rows, dims.cols);
  });
}

void CpuBackend::cross_entropy(const Tensor& logits, const Tensor& labels, Tensor& loss,
                               Tensor& row_stats) {
  const backend_checks::Rows dims =
      backend_checks::cross_entropy(kCPU, logits, labels, loss, row_stats);
  const int64_t rows = dims.rows, cols = dims.cols;
  const int32_t* lab = labels.data_as<int32_t>();
  MIXPREC_DISPATCH_FLOATING(logits.dtype(), "cross_entropy", [&] {
    loss.data_as<float>()[0] = cross_entropy_rows(static_cast<const scalar_t*>(logits.data()),
                                                  lab, row_stats.data_as<float>(), rows, cols);
  });
}

void CpuBackend::cross_entropy_backward(const Tensor& logits, const Tensor& labels,
                                        const Tensor& row_stats, const Tensor& dloss,
                                        Tensor& dlogits) {
  const backend_checks::Rows dims =
      backend_checks::cross_entropy_backward(kCPU, logits, labels, row_stats, dloss, dlogits);
  const int64_t rows = dims.rows, cols = dims.cols;
  const float scale = cross_entropy_grad_scale(dloss.data_as<float>()[0], rows);
  MIXPREC_DISPATCH_FLOATING(logits.dtype(), "cross_entropy_backward", [&] {
    cross_entropy_backward_rows(static_cast<const scalar_t*>(logits.data()),
                                labels.data_as<int32_t>(), row_stats.data_as<float>(), scale,
                                static_cast<scalar_t*>(dlogits.data()), rows, cols);
  });
}

}  // namespace mixprec
