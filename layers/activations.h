// Activation layers without parameters.
#pragma once

#include <string>

#include "layers/module.h"

namespace mixprec {

// max(x, 0) elementwise, as torch.nn.ReLU.
class ReLU : public Module {
 public:
  // applied_before: the layer before this one already applies the relu (a BatchNorm2d with
  // fuse_relu()), so forward passes x through unchanged. The module stays in its place so
  // that the model's layer names and indices do not depend on the fusion.
  explicit ReLU(bool applied_before = false) : applied_before_(applied_before) {}
  Tensor forward(const Tensor& x) override;
  std::string describe() const override {
    return applied_before_ ? "ReLU() (fused into the batchnorm before it)" : "ReLU()";
  }

 private:
  bool applied_before_;
};

// GELU with the tanh approximation (GPT-2's form), i.e. torch.nn.GELU(approximate='tanh').
// torch.nn.GELU() defaults to the erf form, which differs by less than 1e-3; a model loaded
// into torch matches exactly with approximate='tanh'.
class GELU : public Module {
 public:
  // applied_before: the Linear before this one already applies the gelu (Linear::fuse_gelu),
  // so forward passes x through unchanged, keeping the module's place, as ReLU does.
  explicit GELU(bool applied_before = false) : applied_before_(applied_before) {}
  Tensor forward(const Tensor& x) override;
  std::string describe() const override {
    return applied_before_ ? "GELU(approximate='tanh') (fused into the linear before it)"
                           : "GELU(approximate='tanh')";
  }

 private:
  bool applied_before_;
};

}  // namespace mixprec
