// Internal to core/ops (and core/tensor.cpp): tensors derived from an existing one outside
// any graph, a second shape over its storage or a dtype conversion.
#pragma once

#include "core/backend.h"
#include "core/tensor.h"

namespace mixprec::ops {

// A tensor with `shape` (the caller guarantees numel(shape) == x.numel(); nothing is
// checked) over x's storage, with x's dtype and device. Writes through either tensor are
// seen by the other. No autograd: the result has no grad_fn and does not require grad, so
// an op that returns it to the user records its own node.
inline Tensor view_as_shape(const Tensor& x, const Shape& shape) {
  Tensor view = x.detach();
  view.impl()->shape = shape;
  return view;
}

// t converted to `dtype` (rounded once) without recording anything: t itself when it already
// has that dtype, else a new tensor on t's device.
inline Tensor cast_untracked(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor out = Tensor::empty(t.shape(), dtype, t.device());
  if (t.numel() > 0) backend_for(t.device()).cast(t, out);
  return out;
}

}  // namespace mixprec::ops
