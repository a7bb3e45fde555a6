#include "amp/precision.h"

#include "amp/dynamic_loss_scale.h"
#include "amp/no_loss_scale.h"
#include "core/error.h"
#include "core/math_mode.h"

namespace mixprec {

Precision parse_precision(std::string_view text) {
  if (text == "fp32" || text == "float32") return Precision::FP32;
  if (text == "fp16" || text == "float16" || text == "half") return Precision::FP16;
  if (text == "bf16" || text == "bfloat16") return Precision::BF16;
  MIXPREC_FAIL("unknown precision '", text, "': use one of fp32, fp16, bf16 (also accepted: "
               "float32, float16, half, bfloat16)");
}

std::string_view precision_name(Precision precision) {
  switch (precision) {
    case Precision::FP32: return "fp32";
    case Precision::FP16: return "fp16";
    case Precision::BF16: return "bf16";
  }
  MIXPREC_FAIL("precision_name: invalid Precision value ", static_cast<int>(precision));
}

DType PrecisionPolicy::working_dtype() const {
  switch (precision) {
    case Precision::FP32: return DType::F32;
    case Precision::FP16: return DType::F16;
    case Precision::BF16: return DType::BF16;
  }
  MIXPREC_FAIL("PrecisionPolicy: invalid Precision value ", static_cast<int>(precision));
}

std::unique_ptr<LossScalePolicy> PrecisionPolicy::default_loss_scale() const {
  if (needs_loss_scaling()) return std::make_unique<DynamicLossScale>();
  return std::make_unique<NoLossScale>();
}

void PrecisionPolicy::apply(const std::vector<Parameter>& params) const {
  const DType dtype = working_dtype();
  // Checked before anything changes, so a bad list does not leave a half-converted model.
  for (size_t i = 0; i < params.size(); ++i) {
    MIXPREC_CHECK(params[i].defined(), "PrecisionPolicy::apply: parameter ", i, " of ",
                  params.size(), " is undefined; pass only constructed parameters");
  }
  for (const Parameter& param : params) {
    Parameter handle = param;  // a shared handle: switching it switches the caller's parameter
    handle.set_working_dtype(dtype);
  }
  set_tf32_allowed(allow_tf32);
}

std::string PrecisionPolicy::describe() const {
  std::string text(precision_name(precision));
  switch (precision) {
    case Precision::FP32:
      text += ": FP32 activations, weights and gradients";
      break;
    case Precision::FP16:
    case Precision::BF16: {
      const std::string format = precision == Precision::FP16 ? "FP16" : "BF16";
      text += ": " + format + " activations and working weights, FP32 master weights and "
              "gradient buffers, FP32 softmax/cross-entropy/norm statistics/reductions/loss/"
              "attention scores";
      break;
    }
  }
  text += allow_tf32 ? ", TF32 on (CUDA FP32 GEMMs)" : ", TF32 off";
  return text;
}

const std::vector<std::string_view>& fp32_ops() {
  // Names from core/ops/ops.h. layer_norm and batch_norm2d keep their statistics (mean,
  // rstd / invstd, running stats) in FP32; sum and mean accumulate in FP32; the losses
  // (cross_entropy, mse_loss) return F32; causal_attention writes its scores into F32 and
  // masks and normalises them there.
  static const std::vector<std::string_view> ops = {
      "softmax", "log_softmax", "cross_entropy", "mse_loss", "layer_norm",
      "batch_norm2d", "sum", "mean", "causal_attention",
  };
  return ops;
}

}  // namespace mixprec
