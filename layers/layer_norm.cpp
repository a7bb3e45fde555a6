#include "layers/layer_norm.h"

#include <cmath>

#include "core/error.h"
#include "core/ops/ops.h"

namespace mixprec {

LayerNorm::LayerNorm(int64_t dim, bool bias, Device device, double eps) : dim_(dim), eps_(eps) {
  MIXPREC_CHECK(dim >= 1, "LayerNorm: dim must be >= 1, got ", dim);
  MIXPREC_CHECK(std::isfinite(eps) && eps >= 0.0, "LayerNorm: eps must be finite and >= 0, got ",
                eps);
  weight_ = register_parameter("weight", Tensor::ones({dim}, DType::F32, device));
  if (bias) bias_ = register_parameter("bias", Tensor::zeros({dim}, DType::F32, device));
}

Tensor LayerNorm::forward(const Tensor& x) {
  return ops::layer_norm(x, weight_.working(), bias_.defined() ? bias_.working() : Tensor(), eps_);
}

std::string LayerNorm::describe() const {
  return detail::concat("LayerNorm(", dim_, ", eps=", eps_,
                        ", bias=", bias_.defined() ? "true" : "false", ")");
}

}  // namespace mixprec
