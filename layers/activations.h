// Activation layers without parameters.
#pragma once

#include <string>

#include "layers/module.h"

namespace mixprec {

// max(x, 0) elementwise, as torch.nn.ReLU.
class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  std::string describe() const override { return "ReLU()"; }
};

// GELU with the tanh approximation (GPT-2's form), i.e. torch.nn.GELU(approximate='tanh').
// torch.nn.GELU() defaults to the erf form, which differs by less than 1e-3; a model loaded
// into torch matches exactly with approximate='tanh'.
class GELU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  std::string describe() const override { return "GELU(approximate='tanh')"; }
};

}  // namespace mixprec
