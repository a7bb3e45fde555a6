// Dropout: zeroes activations with probability p in training and scales the rest by
// 1 / (1 - p), as torch.nn.Dropout; the identity in eval mode.
#pragma once

#include <memory>
#include <string>

#include "core/generator.h"
#include "layers/module.h"

namespace mixprec {

class Dropout : public Module {
 public:
  // Masks are drawn from `gen`, which the caller owns and checkpoints (several Dropout layers
  // share one). `gen` may be null only when p == 0 (no mask is ever drawn). Throws for p
  // outside [0, 1).
  Dropout(double p, std::shared_ptr<Generator> gen);

  // Any floating x -> same shape and dtype.
  Tensor forward(const Tensor& x) override;
  // residual + (*this)(x) for a residual of x's shape and dtype, with the dropout and the add
  // in one op (ops::dropout_add: same mask, same bits) unless a forward hook watches this
  // layer's output, which then exists as it would without the fusion.
  Tensor added_to(const Tensor& residual, const Tensor& x);
  std::string describe() const override;

  double p() const { return p_; }

 private:
  double p_;
  std::shared_ptr<Generator> gen_;
};

}  // namespace mixprec
