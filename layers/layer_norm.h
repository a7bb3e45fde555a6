// LayerNorm: normalisation over the last dimension, as torch.nn.LayerNorm(normalized_shape =
// [dim]) (nanoGPT's LayerNorm with an optional bias).
#pragma once

#include <cstdint>
#include <string>

#include "core/device.h"
#include "layers/module.h"

namespace mixprec {

class LayerNorm : public Module {
 public:
  // Parameters `weight` (ones) [dim] and, when `bias`, `bias` (zeros) [dim]. Throws for
  // dim < 1 or eps < 0.
  LayerNorm(int64_t dim, bool bias, Device device = kCPU, double eps = 1e-5);

  // x [..., dim] in the working dtype -> same shape; statistics in FP32.
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;

  int64_t dim() const { return dim_; }
  const Parameter& weight() const { return weight_; }
  const Parameter& bias() const { return bias_; }  // undefined without bias

 private:
  int64_t dim_;
  double eps_;
  Parameter weight_, bias_;
};

}  // namespace mixprec
