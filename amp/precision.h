// Precision policy: what `precision: fp32 | fp16 | bf16` means for a training run.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "layers/parameter.h"

namespace mixprec {

class LossScalePolicy;

enum class Precision { FP32, FP16, BF16 };

// "fp32", "fp16", "bf16" (also accepted: "float32", "float16", "half", "bfloat16");
// anything else throws, listing the accepted names.
Precision parse_precision(std::string_view text);
std::string_view precision_name(Precision precision);  // "fp32", "fp16", "bf16"

struct PrecisionPolicy {
  Precision precision = Precision::FP32;
  // Whether FP32 GEMMs may run on TF32 tensor cores (10-bit mantissa inputs). Off by default;
  // it changes FP32 results at the 1e-3 level, so every report states it. Only the CUDA
  // backend has TF32; the CPU always computes full FP32.
  bool allow_tf32 = false;

  // Dtype of activations and working weights: F32, F16 or BF16.
  DType working_dtype() const;
  // True for fp16 only: BF16 has FP32's exponent range and rarely underflows.
  bool needs_loss_scaling() const { return precision == Precision::FP16; }
  // DynamicLossScale with its defaults for fp16, NoLossScale for fp32 and bf16.
  std::unique_ptr<LossScalePolicy> default_loss_scale() const;
  // Gives every parameter this policy's working dtype (their masters stay F32) and sets the
  // process-wide TF32 switch (core/math_mode.h) to allow_tf32.
  void apply(const std::vector<Parameter>& params) const;
  // One line for logs and reports, e.g. "fp16: FP16 activations and working weights, FP32
  // master weights and gradient buffers, FP32 softmax/cross-entropy/norm statistics/
  // reductions/loss, TF32 off".
  std::string describe() const;
};

// Ops that compute in FP32 whatever the working dtype: their 16-bit inputs are widened on
// load and their statistics, accumulators and (for losses) outputs are FP32. Every backend
// implements them that way (core/backend.h); this list is what reports and `mixprec explain`
// show.
const std::vector<std::string_view>& fp32_ops();

}  // namespace mixprec
