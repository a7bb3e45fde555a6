// Internal to core/ops: a second shape over an existing tensor's storage.
#pragma once

#include <memory>
#include <utility>

#include "core/tensor.h"

namespace mixprec::ops {

// A tensor with `shape` (the caller guarantees numel(shape) == x.numel(); nothing is
// checked) over x's storage, with x's dtype and device. Writes through either tensor are
// seen by the other. No autograd: the result has no grad_fn and does not require grad, so
// an op that returns it to the user records its own node.
inline Tensor view_as_shape(const Tensor& x, const Shape& shape) {
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->dtype = x.dtype();
  impl->storage = x.impl()->storage;
  return Tensor(std::move(impl));
}

}  // namespace mixprec::ops
