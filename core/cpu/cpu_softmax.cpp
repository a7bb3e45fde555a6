// Softmax, log-softmax and cross-entropy of the CPU backend: one row per iteration of the
// outer (parallel) loop, FP32 math, one rounding on store.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/backend_checks.h"
#include "core/cpu/blocks.h"
#include "core/cpu/common.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/dispatch.h"
#include "core/cpu/simd.h"
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

// The row loops below are whole-vector loops: exp is exp_vectorisable (core/math/exp.h), and
// a row's maximum and sums are kept in cpu::kLanes lanes (core/cpu/simd.h), whose order is
// fixed by the row length alone. 16-bit rows are widened once into a row buffer first.

// The maximum of v[0, n), NaN skipped as fmaxf skips it (softmax_max_step); -inf for none.
// The sign of a zero maximum cannot change exp(x - max), so which zero wins does not matter.
float row_max(const float* v, int64_t n) {
  constexpr float kNone = -std::numeric_limits<float>::infinity();
  cpu::Floats8 lanes = {kNone, kNone, kNone, kNone, kNone, kNone, kNone, kNone};
  int64_t k = 0;
  for (; k + cpu::kLanes <= n; k += cpu::kLanes) {
    cpu::Floats8 f;
    cpu::load8(v + k, f);
    lanes = f > lanes ? f : lanes;
  }
  float m = kNone;
  for (int j = 0; j < cpu::kLanes; ++j) m = lanes[j] > m ? lanes[j] : m;
  for (; k < n; ++k) m = v[k] > m ? v[k] : m;
  return m;
}

// The sum of v[0, n) in double lanes. A float running sum over a 50k-entry vocabulary would
// lose digits in proportion to the row length, which the result would carry.
double lane_sum(const float* v, int64_t n) {
  cpu::Doubles8 acc{};
  cpu::add_to_lanes(
      acc, n, [v](int64_t k, cpu::Doubles8& a) { cpu::add_widened(v + k, a); },
      [v](int64_t k) { return static_cast<double>(v[k]); });
  return cpu::lane_total(acc);
}

// e[j] = softmax_exp(v[j], max) for the row v[0, n) and its maximum and sum. e may be v.
RowMaxSum exp_row(const float* v, int64_t n, float* e) {
  const float m = row_max(v, n);
#pragma GCC ivdep
  for (int64_t j = 0; j < n; ++j) e[j] = softmax_exp(v[j], m);
  return {m, static_cast<float>(lane_sum(e, n))};
}

// out[j] = e[j] * inv_sum: softmax_value's product of the row's exp terms. A NaN term stays
// itself, as softmax_value's scalar product (the term its first operand) keeps it; the
// vectorised product may take its operands in the other order and give inv_sum's NaN
// instead. out may be e.
void scale_row(const float* e, int64_t n, float inv_sum, float* out) {
#pragma GCC ivdep
  for (int64_t j = 0; j < n; ++j) out[j] = e[j] != e[j] ? e[j] : e[j] * inv_sum;
}

template <class T>
void softmax_rows(const T* x, T* y, int64_t rows, int64_t cols, bool log) {
#pragma omp parallel for if (rows * cols > kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const float* v = cpu::load_f32(x + r * cols, cpu::row_buffer(0, cols), cols);
    float* e = cpu::row_buffer(1, cols);
    const RowMaxSum st = exp_row(v, cols, e);
    float* out = cpu::f32_target(y + r * cols, e);
    if (log) {
      const float log_sum = std::log(st.sum);
#pragma GCC ivdep
      for (int64_t j = 0; j < cols; ++j) out[j] = log_softmax_value(v[j], st.max, log_sum);
    } else {
      scale_row(e, cols, 1.0f / st.sum, out);
    }
    cpu::store_f32(out, y + r * cols, cols);
  }
}

template <class T>
void softmax_backward_rows(const T* y, const T* dy, T* dx, int64_t rows, int64_t cols,
                           bool log) {
#pragma omp parallel for if (rows * cols > kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const float* yv = cpu::load_f32(y + r * cols, cpu::row_buffer(0, cols), cols);
    const float* dv = cpu::load_f32(dy + r * cols, cpu::row_buffer(1, cols), cols);
    float* terms = cpu::row_buffer(2, cols);
    for (int64_t j = 0; j < cols; ++j) terms[j] = softmax_backward_term(yv[j], dv[j], log);
    const float row_dot = static_cast<float>(lane_sum(terms, cols));
    float* out = cpu::f32_target(dx + r * cols, terms);
    // One loop per form: with `log` inside, the loop does not vectorise.
    if (log) {
#pragma GCC ivdep
      for (int64_t j = 0; j < cols; ++j)
        out[j] = softmax_backward_value(yv[j], dv[j], row_dot, true);
    } else {
#pragma GCC ivdep
      for (int64_t j = 0; j < cols; ++j)
        out[j] = softmax_backward_value(yv[j], dv[j], row_dot, false);
    }
    cpu::store_f32(out, dx + r * cols, cols);
  }
}

// attention_softmax over `rows` rows of `cols` F32 scores, row r being row r % matrix_rows of
// its [matrix_rows, cols] matrix, whose columns right of the diagonal the causal mask sets to
// -inf. The row's reduction covers the live columns alone, with the same result: a -inf
// never raises the maximum, and it adds exp(-inf - m) = +0 to the sum (or a NaN when m is
// -inf, which the live column 0 has then added already). Each masked column's value is
// softmax_value(-inf, ...), the same for the whole row; when that is +0 it stays +0 through
// dropout whether kept or dropped, so those columns draw nothing. probs may be scores: each
// live column is read before it is written, the masked ones are not read.
template <class T>
void attention_softmax_rows(const float* scores, float p, PhiloxKey key, float* probs,
                            T* operand, int64_t rows, int64_t matrix_rows, int64_t cols) {
  const float drop_scale = dropout_scale(p);
  const float masked = -std::numeric_limits<float>::infinity();
#pragma omp parallel if (rows * cols > kParallelWork)
  {
    std::vector<float> kept(static_cast<size_t>(cols));
    std::vector<uint8_t> keep(static_cast<size_t>(cols));
#pragma omp for
    for (int64_t r = 0; r < rows; ++r) {
      const float* sr = scores + r * cols;
      float* yr = probs + r * cols;
      const int64_t live = std::min(r % matrix_rows + 1, cols);
      // The exp terms are kept in the output row and scaled there: one exp per element.
      const RowMaxSum st = exp_row(sr, live, yr);
      const float inv_sum = 1.0f / st.sum;
      const float masked_y = softmax_value(masked, st.max, inv_sum);
      scale_row(yr, live, inv_sum, yr);
      std::fill(yr + live, yr + cols, masked_y);
      const float* out = yr;
      if (p > 0.0f) {
        // Dropout in separate loops that the compiler vectorises, Philox included; the masked
        // columns need no draw when their probability is +0.
        const int64_t drawn = masked_y == 0.0f ? live : cols;
        fill_dropout_keep(key, static_cast<uint64_t>(r * cols), drawn, p, keep.data());
        for (int64_t j = 0; j < drawn; ++j)
          kept[j] = dropout_value(yr[j], keep[j] != 0, drop_scale);
        std::fill(kept.begin() + drawn, kept.end(), 0.0f);
        out = kept.data();
      }
      // Rounded by the vectorised bulk converter (core/convert.h: from_float's bits).
      cpu::store_f32(out, operand + r * cols, cols);
    }
  }
}

// attention_softmax_backward over `rows` rows: softmax_backward_rows with dy the dropped-out
// dprobs, formed once per element into a row buffer (one Philox evaluation per four) and
// stored as the separate dropout would store it.
template <class T>
void attention_softmax_backward_rows(const float* probs, const float* dprobs, float p,
                                     PhiloxKey key, T* ds, int64_t rows, int64_t cols) {
  const float drop_scale = dropout_scale(p);
#pragma omp parallel if (rows * cols > kParallelWork)
  {
    std::vector<float> dy(static_cast<size_t>(cols));
    std::vector<uint8_t> keep(static_cast<size_t>(cols));
#pragma omp for
    for (int64_t r = 0; r < rows; ++r) {
      const float* yr = probs + r * cols;
      const float* gr = dprobs + r * cols;
      if (p > 0.0f) {
        // The loops of the separate dropout, which the compiler vectorises, Philox included.
        fill_dropout_keep(key, static_cast<uint64_t>(r * cols), cols, p, keep.data());
        for (int64_t j = 0; j < cols; ++j) dy[j] = dropout_value(gr[j], keep[j] != 0, drop_scale);
      } else {
        std::copy(gr, gr + cols, dy.begin());
      }
      float* terms = cpu::row_buffer(0, cols);
      for (int64_t j = 0; j < cols; ++j) terms[j] = softmax_backward_term(yr[j], dy[j], false);
      const float row_dot = static_cast<float>(lane_sum(terms, cols));
      // The row's results replace dy element by element, then round in one bulk conversion.
      for (int64_t j = 0; j < cols; ++j)
        dy[j] = softmax_backward_value(yr[j], dy[j], row_dot, false);
      cpu::store_f32(dy.data(), ds + r * cols, cols);
    }
  }
}

// Fills row_stats[r] = (m, log s) and returns the mean over rows of the row losses. The mean
// is summed serially in row order so that the loss does not depend on the thread count.
template <class T>
float cross_entropy_rows(const T* logits, const int32_t* labels, float* row_stats,
                         int64_t rows, int64_t cols) {
#pragma omp parallel for if (rows * cols > kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const float* v = cpu::load_f32(logits + r * cols, cpu::row_buffer(0, cols), cols);
    const RowMaxSum st = exp_row(v, cols, cpu::row_buffer(1, cols));
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
    const float* v = cpu::load_f32(logits + r * cols, cpu::row_buffer(0, cols), cols);
    float* out = cpu::f32_target(dlogits + r * cols, cpu::row_buffer(1, cols));
    const float row_max = row_stats[2 * r], log_sum = row_stats[2 * r + 1];
    const int64_t label = labels[r];
#pragma GCC ivdep
    for (int64_t j = 0; j < cols; ++j)
      out[j] = cross_entropy_grad_value(v[j], row_max, log_sum, j == label, scale);
    cpu::store_f32(out, dlogits + r * cols, cols);
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
