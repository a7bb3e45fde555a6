// Per-element math of layer and batch normalisation, shared by the CPU and CUDA backends.
// Conventions follow PyTorch: the normalisation uses the biased variance with eps inside the
// square root; batch norm's running variance is updated with the unbiased variance, and
// running = (1 - momentum) * running + momentum * batch.
#pragma once

#include <cmath>

#include "core/hd.h"

namespace mixprec {

// Finalising the statistics of one row (layer norm) or channel (batch norm) of n values.
// Acc is the reduction's accumulation type: float for layer norm's rows, double for batch
// norm's channels (their sums run over N*H*W terms). The variance never comes from
// E[x^2] - mean^2, which cancels catastrophically when the mean is large against the spread:
// either from a second pass over the values centred on the mean (norm_variance), or from one
// pass centred on a value of the set (shifted_variance; the CPU's batch norm, which saves a
// read of its largest tensors that way).

// Mean of the n values from their sum.
template <class Acc>
MIXPREC_HD Acc norm_mean(Acc sum, Acc n) {
  return sum / n;
}

// Biased variance from the sum of squared deviations from the mean.
template <class Acc>
MIXPREC_HD Acc norm_variance(Acc sum_sq_dev, Acc n) {
  return sum_sq_dev / n;
}

// Biased variance from one pass over d = x - shift: the sums of d and of d^2. With a shift
// close to the mean (a value of the same set) the subtraction loses no more than the
// two-pass form does; never below 0.
template <class Acc>
MIXPREC_HD Acc shifted_variance(Acc sum_d, Acc sum_d2, Acc n) {
  const Acc v = (sum_d2 - sum_d * (sum_d / n)) / n;
  return v > Acc(0) ? v : Acc(0);
}

// 1 / sqrt(var + eps), var being the biased variance.
MIXPREC_HD float norm_rstd(float var, float eps) { return 1.0f / sqrtf(var + eps); }

// The normalised value xhat = (x - mean) * rstd.
MIXPREC_HD float norm_xhat(float x, float mean, float rstd) { return (x - mean) * rstd; }

// y = xhat * weight + bias (weight 1 and bias 0 when the norm has no affine parameters), as
// one fused multiply-add: an explicit fmaf gives the same bits on every compiler and in every
// code path, which batch norm's fused ReLU relies on when its backward recomputes y.
MIXPREC_HD float norm_apply(float x, float mean, float rstd, float weight, float bias) {
  return fmaf(norm_xhat(x, mean, rstd), weight, bias);
}

// g * xhat for layer norm's backward sums (of dy * weight * xhat for dx, of dy * xhat for
// dweight), evaluated as (g * (x - mean)) * rstd.
MIXPREC_HD float layer_norm_grad_xhat(float g, float x, float mean, float rstd) {
  return g * (x - mean) * rstd;
}

// Unbiased variance from the biased one over n >= 2 samples (Bessel's correction).
MIXPREC_HD float unbiased_variance(float biased_var, double n) {
  return static_cast<float>(biased_var * (n / (n - 1.0)));
}

// PyTorch's momentum convention for running statistics, with its one fused multiply-add
// spelt out: the ranks of a data-parallel run replay these updates outside the kernel
// (apps/train/gradient_sync.h) and must round them as it does, whatever a compiler would fuse.
MIXPREC_HD float running_stat_update(float running, float batch, float momentum) {
  return fmaf(momentum, batch, (1.0f - momentum) * running);
}

// Gradient through a normalisation whose statistics depend on the input:
//   dx = scale * (g - mean(g) - xhat * mean(g * xhat)), means over the normalised set.
// Layer norm: g = dy * weight, scale = rstd. Batch norm (training): g = dy,
// scale = weight * invstd.
MIXPREC_HD float norm_backward_value(float g, float xhat, float mean_g, float mean_g_xhat,
                                     float scale) {
  return scale * (g - mean_g - xhat * mean_g_xhat);
}

// The two means norm_backward_value takes, from the sums of g and of g * xhat over the n
// normalised values. When the statistics are constants rather than functions of the input
// (batch norm in eval mode uses the running ones) both are 0, and dx = scale * g.
struct NormBackwardMeans {
  float g, g_xhat;
};

template <class Acc>
MIXPREC_HD NormBackwardMeans norm_backward_means(Acc sum_g, Acc sum_g_xhat, Acc n,
                                                 bool input_statistics) {
  if (!input_statistics) return {0.0f, 0.0f};
  return {static_cast<float>(norm_mean(sum_g, n)), static_cast<float>(norm_mean(sum_g_xhat, n))};
}

}  // namespace mixprec
