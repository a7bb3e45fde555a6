#include "layers/activations.h"

#include "core/ops/ops.h"

namespace mixprec {

Tensor ReLU::forward(const Tensor& x) { return applied_before_ ? x : ops::relu(x); }

Tensor GELU::forward(const Tensor& x) { return applied_before_ ? x : ops::gelu(x); }

}  // namespace mixprec
