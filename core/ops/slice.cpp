// slice: the range [start, end) of one dimension, copied out through Backend::copy_narrow;
// the gradient is zero outside the range. Whole elements move, so every dtype works (I32 ids
// included); only floating tensors carry gradients.
#include <string>
#include <vector>

#include "core/autograd/record.h"
#include "core/backend.h"
#include "core/ops/narrow.h"
#include "core/ops/ops.h"

namespace mixprec::ops {
namespace {

struct SliceBackward final : Node {
  Shape input_shape;
  int64_t dim = 0, start = 0, length = 0;
  std::string name() const override { return "slice"; }
  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    Tensor gx = Tensor::zeros(input_shape, g.dtype(), g.device());
    backend_for(g.device()).copy_narrow(g, dim, 0, gx, start, length);
    return {gx};
  }
};

}  // namespace

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end) {
  check_layout_input("slice", x);
  MIXPREC_CHECK(x.dim() > 0, "slice: cannot slice a scalar (", describe(x), ")");
  const int64_t d = wrap_dim("slice", dim, x);
  const int64_t extent = x.shape()[d];
  const int64_t s = start < 0 ? start + extent : start;
  const int64_t e = end < 0 ? end + extent : end;
  MIXPREC_CHECK(s >= 0 && e <= extent && s < e, "slice: range [", start, ", ", end,
                ") is empty or out of bounds for dimension ", dim, " of ", describe(x),
                " (extent ", extent, ")");
  Tensor y = narrow_copy(x, d, s, e - s);
  if (auto node = make_node<SliceBackward>({&x})) {
    node->input_shape = x.shape();
    node->dim = d;
    node->start = s;
    node->length = e - s;
    attach_output(node, y);
  }
  return y;
}

}  // namespace mixprec::ops
