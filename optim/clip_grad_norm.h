// Gradient clipping by global L2 norm (torch.nn.utils.clip_grad_norm_).
#pragma once

#include <vector>

#include "layers/parameter.h"

namespace mixprec {

struct ClipOptions {
  // Clipping gradients that still carry a loss scale clips the wrong norm (the scaled one,
  // S times too large) and is almost always a bug: call GradScaler::unscale first. Set this
  // only to demonstrate or test that mistake.
  bool allow_scaled = false;
  // Throw when the total norm is Inf or NaN instead of returning it.
  bool error_if_nonfinite = false;
};

// Total L2 norm of all gradients of `params` (those without a gradient are skipped),
// per-tensor sums of squares accumulated in FP32 and combined in double. When it exceeds
// max_norm every gradient is multiplied by max_norm / (norm + 1e-6), in place. Returns the
// norm measured before clipping (NaN or Inf when a gradient is non-finite; nothing is then
// scaled). Throws for max_norm <= 0 or non-finite, and — unless options.allow_scaled — when a
// gradient still carries a loss scale (Tensor::grad_scale() != 1), naming the parameter.
double clip_grad_norm(const std::vector<Parameter>& params, double max_norm,
                      ClipOptions options = {});

// clip_grad_norm without a host read (Backend::clip_by_total_norm): the same norm and the
// same rescale, bit for bit, decided on the gradients' device. Returns the norm as an F32
// [1] tensor there, to be read when it is logged. Needs every gradient on one device (throws
// otherwise, and for no gradient at all); error_if_nonfinite is not available (it would need
// the read); the other checks are clip_grad_norm's.
Tensor clip_grad_norm_on_device(const std::vector<Parameter>& params, double max_norm,
                                ClipOptions options = {});

}  // namespace mixprec
