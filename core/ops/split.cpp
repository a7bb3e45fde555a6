// split: consecutive blocks of one dimension, each copied out through Backend::copy_narrow;
// the gradient puts every piece's gradient back into its block. Whole elements move, so
// every dtype works (I32 ids included); only floating tensors carry gradients.
#include <string>
#include <utility>
#include <vector>

#include "core/autograd/record.h"
#include "core/backend.h"
#include "core/ops/narrow.h"
#include "core/ops/ops.h"

namespace mixprec::ops {
namespace {

struct SplitBackward final : Node {
  Shape input_shape;
  int64_t dim = 0;
  std::vector<int64_t> offsets, lengths;
  std::string name() const override { return "split"; }
  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    const Tensor& first = grads[0];
    Tensor gx = Tensor::empty(input_shape, first.dtype(), first.device());
    Backend& backend = backend_for(first.device());
    for (size_t i = 0; i < grads.size(); ++i)
      backend.copy_narrow(grads[i], dim, 0, gx, offsets[i], lengths[i]);
    return {gx};
  }
};

}  // namespace

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  check_layout_input("split", x);
  MIXPREC_CHECK(x.dim() > 0, "split: cannot split a scalar (", describe(x), ")");
  const int64_t d = wrap_dim("split", dim, x);
  MIXPREC_CHECK(!sizes.empty(), "split: no sizes given for ", describe(x));
  int64_t total = 0;
  for (int64_t s : sizes) {
    MIXPREC_CHECK(s > 0, "split: sizes ", shape_str(sizes), " must all be positive (splitting ",
                  describe(x), ")");
    total += s;
  }
  MIXPREC_CHECK(total == x.shape()[d], "split: sizes ", shape_str(sizes), " sum to ", total,
                " but dimension ", dim, " of ", describe(x), " has extent ", x.shape()[d]);
  std::vector<Tensor> pieces;
  std::vector<int64_t> offsets;
  int64_t offset = 0;
  for (int64_t s : sizes) {
    pieces.push_back(narrow_copy(x, d, offset, s));
    offsets.push_back(offset);
    offset += s;
  }
  if (auto node = make_node<SplitBackward>({&x})) {
    node->input_shape = x.shape();
    node->dim = d;
    node->offsets = std::move(offsets);
    node->lengths = sizes;
    for (size_t i = 0; i < pieces.size(); ++i)
      attach_output(node, pieces[i], static_cast<int>(i));
  }
  return pieces;
}

}  // namespace mixprec::ops
