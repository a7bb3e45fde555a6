#include "layers/conv2d.h"

#include <cmath>

#include "core/error.h"
#include "core/ops/ops.h"

namespace mixprec {

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride,
               int64_t padding, bool bias, Generator& init, Device device)
    : in_channels_(in_channels),
      out_channels_(out_channels),
      kernel_(kernel),
      stride_(stride),
      padding_(padding) {
  MIXPREC_CHECK(in_channels >= 1 && out_channels >= 1, "Conv2d: in_channels (", in_channels,
                ") and out_channels (", out_channels, ") must be >= 1");
  MIXPREC_CHECK(kernel >= 1, "Conv2d: kernel must be >= 1, got ", kernel);
  MIXPREC_CHECK(stride >= 1, "Conv2d: stride must be >= 1, got ", stride);
  MIXPREC_CHECK(padding >= 0, "Conv2d: padding must be >= 0, got ", padding);
  // As Linear: kaiming_uniform(a = sqrt(5)) reduces to the bound 1 / sqrt(fan_in).
  const double fan_in = static_cast<double>(in_channels * kernel * kernel);
  const float bound = static_cast<float>(1.0 / std::sqrt(fan_in));
  weight_ =
      register_parameter("weight", Tensor::uniform({out_channels, in_channels, kernel, kernel},
                                                   init, -bound, bound, DType::F32, device));
  if (bias)
    bias_ = register_parameter(
        "bias", Tensor::uniform({out_channels}, init, -bound, bound, DType::F32, device));
}

Tensor Conv2d::forward(const Tensor& x) {
  return ops::conv2d(x, weight_.working(), bias_.defined() ? bias_.working() : Tensor(), stride_,
                     padding_);
}

std::string Conv2d::describe() const {
  return detail::concat("Conv2d(", in_channels_, ", ", out_channels_, ", kernel_size=", kernel_,
                        ", stride=", stride_, ", padding=", padding_,
                        ", bias=", bias_.defined() ? "true" : "false", ")");
}

}  // namespace mixprec
