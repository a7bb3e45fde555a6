// Per-element arithmetic of mixed-precision training, shared by the CPU and CUDA backends:
// the unscale-and-check of one gradient value, one SGD or Adam/AdamW update, and the dynamic
// loss-scale rule. A kernel adds only indexing and launch around these functions, so the CPU
// tests cover the arithmetic the GPU runs.
#pragma once

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include <type_traits>

#include "core/half.h"
#include "core/hd.h"

namespace mixprec {

// ---- unscale ---------------------------------------------------------------------------

// g / S as g * inv_scale, the product taken in double and rounded once to float by the
// caller's store. inv_scale = 1.0 / S is computed in double by the caller, so a power-of-two
// scale restores the value exactly and any other scale loses at most one FP32 rounding.
MIXPREC_HD double unscale_value(float scaled_grad, double inv_scale) {
  return static_cast<double>(scaled_grad) * inv_scale;
}

MIXPREC_HD bool is_finite_value(float value) { return isfinite(value) != 0; }

// is_finite_value of a stored element, read from its bits where it is 16-bit (an all-ones
// exponent is an infinity or a NaN): no conversion, so a check of F16 or BF16 data is a
// vectorised loop of masks.
MIXPREC_HD bool is_finite_element(float value) { return is_finite_value(value); }
MIXPREC_HD bool is_finite_element(half value) { return (value.bits & 0x7C00u) != 0x7C00u; }
MIXPREC_HD bool is_finite_element(bfloat16 value) { return (value.bits & 0x7F80u) != 0x7F80u; }

// The narrowing of a double to float that keeps one later rounding exact: round to odd
// (truncate toward zero, then set the last bit when inexact). double -> float -> F16/BF16
// with round-to-nearest in both steps could round twice (a float landing exactly on a
// 16-bit midpoint); a float has at least two more significand bits than F16 or BF16 in every
// binade they reach, so round-to-odd followed by round-to-nearest-even equals one
// round-to-nearest-even of the double. Values beyond FLT_MAX narrow to FLT_MAX, which every
// 16-bit format then rounds to infinity, as a direct rounding would.
MIXPREC_HD float narrow_round_to_odd(double value) {
  float f = static_cast<float>(value);
  if (!isfinite(value) || static_cast<double>(f) == value) return f;
  if (fabs(static_cast<double>(f)) > fabs(value)) {
    // Rounded away from zero (possibly to infinity): step one unit back toward zero.
    f = detail::f32_from_bits(detail::f32_to_bits(f) - 1u);
  }
  return detail::f32_from_bits(detail::f32_to_bits(f) | 1u);
}

// The unscale of one gradient value of storage type T: the product in double rounded once
// to T. `bad` is set when the value is non-finite as it arrived (still scaled) or becomes
// non-finite when unscaled (possible when S < 1 pushes a large finite value past the range
// of T), so neither can reach a weight.
template <class T>
MIXPREC_HD T unscale_and_check_value(T scaled, double inv_scale, bool& bad) {
  const float g = to_float(scaled);
  const double u = unscale_value(g, inv_scale);
  T result;
  if constexpr (sizeof(T) == sizeof(float)) result = static_cast<float>(u);
  else result = from_float<T>(narrow_round_to_odd(u));
  bad = !is_finite_value(g) || !is_finite_value(to_float(result));
  return result;
}

// ---- SGD -------------------------------------------------------------------------------

// PyTorch's torch.optim.SGD semantics, per element.
struct SgdHyper {
  float lr = 0.01f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;  // L2 penalty added to the gradient (coupled)
  bool nesterov = false;
  // True on the parameter's first update: the momentum buffer is initialised with the
  // gradient itself rather than blended (PyTorch's behaviour).
  bool first_step = false;
};

// Updates the FP32 master value `w` from the true-scale gradient `g`; `buf` is the
// momentum buffer (ignored when hyper.momentum == 0).
MIXPREC_HD void sgd_update(float& w, float g, float& buf, const SgdHyper& hyper) {
  float d = g;
  if (hyper.weight_decay != 0.0f) d += hyper.weight_decay * w;
  if (hyper.momentum != 0.0f) {
    buf = hyper.first_step ? d : hyper.momentum * buf + (1.0f - hyper.dampening) * d;
    d = hyper.nesterov ? d + hyper.momentum * buf : buf;
  }
  w -= hyper.lr * d;
}

// ---- Adam and AdamW --------------------------------------------------------------------

// torch.optim.Adam (decoupled_weight_decay false) and torch.optim.AdamW (true), per element,
// without amsgrad. The hyperparameters are the FP32 values the update computes with.
//
// The bias corrections depend only on the step, so set_step() computes them once per step
// on the host, in double, and rounds each once to float: no kernel evaluates a power per
// element. Set the hyperparameters first, then call set_step(t) before every update; the
// backends reject a hyper whose derived fields do not match its step and hyperparameters.
struct AdamHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  // false: Adam, the L2 penalty weight_decay * w is added to the gradient (coupled);
  // true: AdamW, the weight shrinks by the factor 1 - lr * weight_decay before the update.
  bool decoupled_weight_decay = false;

  // Derived by set_step().
  int64_t step = 0;                    // 1-based index of the update being applied
  float step_size = 0.0f;              // lr / (1 - beta1^step)
  float bias_correction2_sqrt = 0.0f;  // sqrt(1 - beta2^step)
  float decay_factor = 1.0f;           // 1 - lr * weight_decay for AdamW, else 1

  // Host only. t >= 1; the values are as PyTorch computes them from its Python floats (in
  // double), each rounded once to float.
  void set_step(int64_t t) {
    step = t;
    const double n = static_cast<double>(t), rate = lr;
    step_size = static_cast<float>(rate / (1.0 - pow(static_cast<double>(beta1), n)));
    bias_correction2_sqrt = static_cast<float>(sqrt(1.0 - pow(static_cast<double>(beta2), n)));
    decay_factor = decoupled_weight_decay ? static_cast<float>(1.0 - rate * weight_decay) : 1.0f;
  }
};

// Updates the FP32 master value `w` from the true-scale gradient `g`; `m` and `v` are the
// first and second moment estimates (exp_avg, exp_avg_sq). The operations and their order
// are PyTorch's (its lerp of m written as the blend it equals):
//   Adam:  g += weight_decay * w          AdamW: w *= 1 - lr * weight_decay
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g * g
//   w -= step_size * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// which is w -= lr * m_hat / (sqrt(v_hat) + eps) with m_hat = m / (1 - beta1^t) and
// v_hat = v / (1 - beta2^t), eps added outside the square root.
MIXPREC_HD void adam_update(float& w, float g, float& m, float& v, const AdamHyper& hyper) {
  float d = g;
  if (hyper.decoupled_weight_decay) w *= hyper.decay_factor;
  else if (hyper.weight_decay != 0.0f) d += hyper.weight_decay * w;
  m = hyper.beta1 * m + (1.0f - hyper.beta1) * d;
  v = hyper.beta2 * v + (1.0f - hyper.beta2) * d * d;
  const float denom = sqrtf(v) / hyper.bias_correction2_sqrt + hyper.eps;
  w -= hyper.step_size * m / denom;
}

// ---- the dynamic loss-scale rule ---------------------------------------------------------

// How hysteresis (overflows tolerated before backing off) is refilled.
enum class HysteresisMode : uint8_t {
  ResetOnGrowth,  // refilled only when the scale grows (DeepSpeed's default)
  Consecutive,    // refilled by every finite step: only consecutive overflows count
};

// Settings of DynamicLossScale (validated by the policy, amp/dynamic_loss_scale.h).
struct DynamicScaleRule {
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int32_t growth_interval = 2000;
  int32_t hysteresis = 1;  // 1: back off on every overflow (PyTorch)
  HysteresisMode hysteresis_mode = HysteresisMode::ResetOnGrowth;
  double min_scale = 1.0;
  double max_scale = 16777216.0;  // 2^24
};

// What one update did to the scale.
enum class ScaleEvent : uint8_t {
  Kept,               // finite step, no growth yet (or already at max_scale)
  Grew,               // growth_interval finite steps in a row: scale *= growth_factor
  BackedOff,          // overflow: scale *= backoff_factor (clamped to min_scale)
  OverflowTolerated,  // overflow absorbed by hysteresis: scale unchanged
  OverflowAtFloor,    // overflow with the scale already at min_scale: nothing lower to go to
};

struct DynamicScaleState {
  double scale = 65536.0;
  int32_t growth_tracker = 0;   // finite steps since the last overflow or growth
  int32_t hysteresis_left = 1;  // overflows still tolerated before the next backoff
};

// Backend::update_loss_scale keeps a DynamicScaleState in an I32 tensor of
// kDynamicScaleStateWords elements, byte for byte: the scale's 8 bytes in elements 0 and 1,
// growth_tracker in element 2, hysteresis_left in element 3. The same bytes on the host and
// the device, so the state is copied in either direction as it is.
inline constexpr int64_t kDynamicScaleStateWords = 4;
static_assert(sizeof(DynamicScaleState) == kDynamicScaleStateWords * sizeof(int32_t) &&
                  offsetof(DynamicScaleState, scale) == 0 &&
                  offsetof(DynamicScaleState, growth_tracker) == 8 &&
                  offsetof(DynamicScaleState, hysteresis_left) == 12 &&
                  std::is_trivially_copyable_v<DynamicScaleState>,
              "DynamicScaleState must be the 16 bytes of an I32 [4] tensor");

// The scale-update rule, run once per effective step with that step's found_inf.
// - overflow: the growth tracker restarts; while more than one tolerated overflow is left
//   one is used up, otherwise the scale backs off (never below min_scale);
// - finite: the tracker counts up; at growth_interval the scale grows, capped at max_scale,
//   so it never becomes non-finite (a product that overflows double is capped too).
MIXPREC_HD ScaleEvent update_dynamic_scale(const DynamicScaleRule& rule, DynamicScaleState& state,
                                           bool found_inf) {
  if (found_inf) {
    state.growth_tracker = 0;
    if (state.hysteresis_left > 1) {
      state.hysteresis_left -= 1;
      return ScaleEvent::OverflowTolerated;
    }
    if (state.scale <= rule.min_scale) {
      state.scale = rule.min_scale;
      return ScaleEvent::OverflowAtFloor;
    }
    const double next = state.scale * rule.backoff_factor;
    state.scale = next < rule.min_scale ? rule.min_scale : next;
    return ScaleEvent::BackedOff;
  }
  if (rule.hysteresis_mode == HysteresisMode::Consecutive) state.hysteresis_left = rule.hysteresis;
  state.growth_tracker += 1;
  if (state.growth_tracker < rule.growth_interval) return ScaleEvent::Kept;
  state.growth_tracker = 0;
  if (rule.hysteresis_mode == HysteresisMode::ResetOnGrowth) state.hysteresis_left = rule.hysteresis;
  double next = state.scale * rule.growth_factor;
  if (!(next <= rule.max_scale)) next = rule.max_scale;  // also catches inf and NaN
  if (next <= state.scale) return ScaleEvent::Kept;
  state.scale = next;
  return ScaleEvent::Grew;
}

// ---- deferred steps (device-resolved skips) ----------------------------------------------

// A step whose skip is decided on the device: the host queues the update before it knows how
// many of the steps still unresolved were taken, so it passes one set of per-step values for
// every possible count j = 0, 1, ..., count - 1 and the kernel picks entry j, read from a
// device counter of steps taken since the host last resolved. The values are computed on the
// host exactly as for an immediate step (AdamHyper::set_step, the LR schedule), so a deferred
// update has the same bits as the immediate one it stands for. On a GPU the multi-tensor
// step uploads the tables of all parameters (those that are equal once) through the pinned
// ring with the step's other arguments, without waiting for the device.
inline constexpr int32_t kMaxDeferredSteps = 64;

struct AdamStepRates {
  float lr = 0.0f;
  float step_size = 0.0f;
  float bias_correction2_sqrt = 0.0f;
  float decay_factor = 1.0f;
  int64_t step = 0;
};

struct AdamRateTable {
  AdamStepRates entry[kMaxDeferredSteps];
  int32_t count = 0;  // entries in use, 1 ..= kMaxDeferredSteps
};

struct SgdStepRates {
  float lr = 0.0f;
  int32_t first_step = 0;  // 1: the momentum buffer starts from this update's gradient
};

struct SgdRateTable {
  SgdStepRates entry[kMaxDeferredSteps];
  int32_t count = 0;
};

// `base` (lr, betas, eps, weight_decay, decoupled_weight_decay) with entry `rates`'s derived
// fields.
MIXPREC_HD AdamHyper adam_hyper_with(const AdamHyper& base, const AdamStepRates& rates) {
  AdamHyper hyper = base;
  hyper.lr = rates.lr;
  hyper.step = rates.step;
  hyper.step_size = rates.step_size;
  hyper.bias_correction2_sqrt = rates.bias_correction2_sqrt;
  hyper.decay_factor = rates.decay_factor;
  return hyper;
}

MIXPREC_HD SgdHyper sgd_hyper_with(const SgdHyper& base, const SgdStepRates& rates) {
  SgdHyper hyper = base;
  hyper.lr = rates.lr;
  hyper.first_step = rates.first_step != 0;
  return hyper;
}

// The one-entry rates of an immediate step: adam_hyper_with(hyper, rates_of(hyper)) and
// sgd_hyper_with(hyper, rates_of(hyper)) give `hyper` back, field for field.
MIXPREC_HD AdamStepRates rates_of(const AdamHyper& hyper) {
  return {hyper.lr, hyper.step_size, hyper.bias_correction2_sqrt, hyper.decay_factor,
          hyper.step};
}

MIXPREC_HD SgdStepRates rates_of(const SgdHyper& hyper) {
  return {hyper.lr, hyper.first_step ? 1 : 0};
}

// The factor that clip_grad_norm multiplies every gradient by, from the total norm in double:
// max_norm / (norm + 1e-6) when that is below 1, else 1 (no clipping); 1 as well when the
// norm is not finite (the step is skipped by the Inf/NaN check instead).
MIXPREC_HD double clip_coefficient(double norm, double max_norm) {
  if (!isfinite(norm)) return 1.0;
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}

}  // namespace mixprec
