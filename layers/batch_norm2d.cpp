#include "layers/batch_norm2d.h"

#include <cmath>

#include "core/error.h"
#include "core/ops/ops.h"

namespace mixprec {

BatchNorm2d::BatchNorm2d(int64_t num_features, Device device, double eps, double momentum)
    : num_features_(num_features), eps_(eps), momentum_(momentum) {
  MIXPREC_CHECK(num_features >= 1, "BatchNorm2d: num_features must be >= 1, got ", num_features);
  MIXPREC_CHECK(std::isfinite(eps) && eps >= 0.0, "BatchNorm2d: eps must be finite and >= 0, got ",
                eps);
  MIXPREC_CHECK(momentum >= 0.0 && momentum <= 1.0, "BatchNorm2d: momentum must be in [0, 1], got ",
                momentum);
  weight_ = register_parameter("weight", Tensor::ones({num_features}, DType::F32, device));
  bias_ = register_parameter("bias", Tensor::zeros({num_features}, DType::F32, device));
  running_mean_ =
      &register_buffer("running_mean", Tensor::zeros({num_features}, DType::F32, device));
  running_var_ = &register_buffer("running_var", Tensor::ones({num_features}, DType::F32, device));
  num_batches_tracked_ = &register_buffer("num_batches_tracked", Tensor::zeros({}, DType::I32));
}

Tensor BatchNorm2d::forward(const Tensor& x) {
  Tensor y = ops::batch_norm2d(x, weight_.working(), bias_.working(), *running_mean_, *running_var_,
                               is_training(), momentum_, eps_, fused_relu_);
  // Counted only once the statistics were really updated (the op throws before writing).
  if (is_training()) num_batches_tracked_->set(0, num_batches_tracked_->get(0) + 1.0);
  return y;
}

void BatchNorm2d::set_num_batches_tracked(int64_t count) {
  num_batches_tracked_->set(0, static_cast<double>(count));
}

void BatchNorm2d::set_momentum(double momentum) {
  MIXPREC_CHECK(momentum >= 0.0 && momentum <= 1.0, "BatchNorm2d: momentum must be in [0, 1], got ",
                momentum);
  momentum_ = momentum;
}

int64_t BatchNorm2d::num_batches_tracked() const {
  return static_cast<int64_t>(num_batches_tracked_->get(0));
}

std::string BatchNorm2d::describe() const {
  return detail::concat("BatchNorm2d(", num_features_, ", eps=", eps_, ", momentum=", momentum_,
                        ")", fused_relu_ ? " + ReLU" : "");
}

}  // namespace mixprec
