// Per-element math of softmax, log-softmax and cross-entropy, shared by the CPU and CUDA
// backends. A kernel reduces each row to its maximum m and to s = sum_j exp(x_j - m) and then
// calls these functions per element. Subtracting the row maximum keeps every exponent <= 0,
// so exp never overflows and the largest term is exactly 1 (s >= 1, log(s) is finite);
// log-softmax is formed as x - m - log(s) and never takes the log of a tiny probability.
// Every exp is exp_vectorisable (core/math/exp.h): the CPU's row loops vectorise, and both
// backends compute the same bits.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/hd.h"
#include "core/math/exp.h"

namespace mixprec {

// One step of the row-maximum reduction. fmaxf skips a NaN operand, so the maximum is that
// of the row's numbers; a NaN element still turns its row's sum, and so the row, into NaN.
MIXPREC_HD float softmax_max_step(float running_max, float x) { return fmaxf(running_max, x); }

// exp(x - row_max): the unnormalised probability of one element.
MIXPREC_HD float softmax_exp(float x, float row_max) { return exp_vectorisable(x - row_max); }

// softmax_j = exp(x_j - m) / s, given inv_sum = 1 / s.
MIXPREC_HD float softmax_value(float x, float row_max, float inv_sum) {
  return exp_vectorisable(x - row_max) * inv_sum;
}

// log_softmax_j = x_j - m - log(s), given log_sum = log(s).
MIXPREC_HD float log_softmax_value(float x, float row_max, float log_sum) {
  return x - row_max - log_sum;
}

// The row reduction the backward needs, one term per element: softmax sums y_j * dy_j,
// log-softmax sums dy_j.
MIXPREC_HD float softmax_backward_term(float y, float dy, bool log) { return log ? dy : y * dy; }

// dx_j from the output y_j, its gradient dy_j and `dot`, the row sum of softmax_backward_term:
//   softmax:      dx_j = y_j (dy_j - sum_k y_k dy_k)
//   log-softmax:  dx_j = dy_j - exp(y_j) sum_k dy_k
MIXPREC_HD float softmax_backward_value(float y, float dy, float dot, bool log) {
  return log ? dy - exp_vectorisable(y) * dot : y * (dy - dot);
}

// Cross-entropy of one row, -log softmax_label = (m - logit_label) + log(s), in double. The
// row maximum m and log(s) are kept apart rather than summed into log-sum-exp first: their
// float sum would carry an error proportional to |m|, which for logits near the FP16 limit
// is larger than the loss itself can tolerate. The mean over the rows is accumulated in
// double and rounded to float once (cross_entropy_mean).
MIXPREC_HD double cross_entropy_row_loss(float row_max, float log_sum, float label_logit) {
  return (static_cast<double>(row_max) - static_cast<double>(label_logit)) +
         static_cast<double>(log_sum);
}
// The loss: the mean over N rows of their cross_entropy_row_loss, given the sum.
MIXPREC_HD float cross_entropy_mean(double total, int64_t rows) {
  return static_cast<float>(total / static_cast<double>(rows));
}

// The factor of every element of dlogits: dloss / N, dloss being the gradient of the mean.
MIXPREC_HD float cross_entropy_grad_scale(float dloss, int64_t rows) {
  return dloss / static_cast<float>(rows);
}

// One element of d(mean cross-entropy)/dlogits: scale * (softmax_j - [j == label]), where
// softmax_j = exp((logit_j - m) - log(s)) (m and log(s) apart, as in cross_entropy_row_loss)
// and scale = dloss / N.
MIXPREC_HD float cross_entropy_grad_value(float logit, float row_max, float log_sum,
                                          bool is_label, float scale) {
  return scale * (exp_vectorisable((logit - row_max) - log_sum) - (is_label ? 1.0f : 0.0f));
}

}  // namespace mixprec
