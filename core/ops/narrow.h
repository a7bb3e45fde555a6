// Internal to core/ops: what the data-moving layout ops (permute and transpose, concat, split,
// slice) share. Tensors are always contiguous, so each of these ops copies; concat, split and
// slice move blocks along one dimension through Backend::copy_narrow.
#pragma once

#include "core/backend.h"
#include "core/error.h"
#include "core/ops/dims.h"
#include "core/tensor.h"

namespace mixprec::ops {

// The single input of a layout op must be defined and non-empty.
inline void check_layout_input(const char* op, const Tensor& x) {
  MIXPREC_CHECK(x.defined(), op, ": input is an undefined tensor");
  MIXPREC_CHECK(x.numel() > 0, op, ": input ", describe(x), " is empty");
}

// A new tensor holding x[start, start + length) along `dim` (already wrapped and in range).
inline Tensor narrow_copy(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  Shape shape = x.shape();
  shape[dim] = length;
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  backend_for(x.device()).copy_narrow(x, dim, start, out, 0, length);
  return out;
}

}  // namespace mixprec::ops
