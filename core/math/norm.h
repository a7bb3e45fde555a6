// Per-element math of layer and batch normalisation, shared by the CPU and CUDA backends.
// Conventions follow PyTorch: the normalisation uses the biased variance with eps inside the
// square root; batch norm's running variance is updated with the unbiased variance, and
// running = (1 - momentum) * running + momentum * batch.
#pragma once

#include <cmath>

#include "core/hd.h"

namespace mixprec {

// 1 / sqrt(var + eps), var being the biased variance.
MIXPREC_HD float norm_rstd(float var, float eps) { return 1.0f / sqrtf(var + eps); }

// y = (x - mean) * rstd * weight + bias.
MIXPREC_HD float norm_apply(float x, float mean, float rstd, float weight, float bias) {
  return (x - mean) * rstd * weight + bias;
}

// Unbiased variance from the biased one over n >= 2 samples (Bessel's correction).
MIXPREC_HD float unbiased_variance(float biased_var, double n) {
  return static_cast<float>(biased_var * (n / (n - 1.0)));
}

// PyTorch's momentum convention for running statistics.
MIXPREC_HD float running_stat_update(float running, float batch, float momentum) {
  return (1.0f - momentum) * running + momentum * batch;
}

// Gradient through a normalisation whose statistics depend on the input:
//   dx = scale * (g - mean(g) - xhat * mean(g * xhat)), means over the normalised set.
// Layer norm: g = dy * weight, scale = rstd. Batch norm (training): g = dy,
// scale = weight * invstd.
MIXPREC_HD float norm_backward_value(float g, float xhat, float mean_g, float mean_g_xhat,
                                     float scale) {
  return scale * (g - mean_g - xhat * mean_g_xhat);
}

}  // namespace mixprec
