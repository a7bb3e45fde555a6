#include "layers/linear.h"

#include <cmath>

#include "core/error.h"
#include "core/ops/ops.h"

namespace mixprec {

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, Generator& init, Device device)
    : in_features_(in_features), out_features_(out_features) {
  MIXPREC_CHECK(in_features >= 1 && out_features >= 1, "Linear: in_features (", in_features,
                ") and out_features (", out_features, ") must be >= 1");
  // kaiming_uniform(a = sqrt(5)) has bound gain * sqrt(3 / fan_in) with gain = sqrt(2 / (1 +
  // 5)), which is 1 / sqrt(fan_in): the same bound torch uses for the bias.
  const float bound = static_cast<float>(1.0 / std::sqrt(static_cast<double>(in_features)));
  weight_ = register_parameter("weight", Tensor::uniform({out_features, in_features}, init, -bound,
                                                         bound, DType::F32, device));
  if (bias)
    bias_ = register_parameter(
        "bias", Tensor::uniform({out_features}, init, -bound, bound, DType::F32, device));
}

Linear::Linear(const Parameter& weight) {
  MIXPREC_CHECK(weight.defined() && weight.shape().size() == 2,
                "Linear: a shared weight must be a defined 2-D parameter [out, in]",
                weight.defined() ? ", got " + shape_str(weight.shape()) : std::string());
  out_features_ = weight.shape()[0];
  in_features_ = weight.shape()[1];
  register_shared_parameter("weight", weight);
  weight_ = weight;
}

void Linear::fuse_gelu() { fused_gelu_ = true; }

Tensor Linear::forward(const Tensor& x) {
  const Tensor bias = bias_.defined() ? bias_.working() : Tensor();
  return fused_gelu_ ? ops::linear_gelu(x, weight_.working(), bias)
                     : ops::linear(x, weight_.working(), bias);
}

std::string Linear::describe() const {
  return detail::concat("Linear(in_features=", in_features_, ", out_features=", out_features_,
                        ", bias=", bias_.defined() ? "true" : "false", ")",
                        fused_gelu_ ? " + GELU (fused)" : "");
}

}  // namespace mixprec
