// concat: the inputs copied one after another along one dimension through
// Backend::copy_narrow; each input's gradient is its block of the output gradient. Whole
// elements move, so every dtype works (I32 ids included); only floating tensors carry
// gradients.
#include <string>
#include <utility>
#include <vector>

#include "core/autograd/record.h"
#include "core/backend.h"
#include "core/ops/narrow.h"
#include "core/ops/ops.h"

namespace mixprec::ops {
namespace {

struct ConcatBackward final : Node {
  int64_t dim = 0;
  std::vector<int64_t> offsets, lengths;
  std::string name() const override { return "concat"; }
  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    std::vector<Tensor> out(next_edges.size());
    for (size_t i = 0; i < out.size(); ++i)
      if (next_edges[i].valid()) out[i] = narrow_copy(g, dim, offsets[i], lengths[i]);
    return out;
  }
};

}  // namespace

Tensor concat(const std::vector<Tensor>& xs, int64_t dim) {
  MIXPREC_CHECK(!xs.empty(), "concat: no tensors given");
  for (size_t i = 0; i < xs.size(); ++i) {
    MIXPREC_CHECK(xs[i].defined(), "concat: tensor ", i, " is undefined");
    MIXPREC_CHECK(xs[i].numel() > 0, "concat: tensor ", i, " ", describe(xs[i]), " is empty");
  }
  const Tensor& first = xs[0];
  MIXPREC_CHECK(first.dim() > 0, "concat: cannot concatenate scalars (", describe(first), ")");
  const int64_t d = wrap_dim("concat", dim, first);
  Shape shape = first.shape();
  shape[d] = 0;
  std::vector<int64_t> offsets, lengths;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    MIXPREC_CHECK(x.dtype() == first.dtype() && x.device() == first.device(),
                  "concat: tensor ", i, " ", describe(x),
                  " does not match the dtype and device of tensor 0 ", describe(first),
                  " (convert explicitly with .to(dtype))");
    bool compatible = x.dim() == first.dim();
    for (int64_t k = 0; compatible && k < x.dim(); ++k)
      compatible = k == d || x.shape()[k] == first.shape()[k];
    MIXPREC_CHECK(compatible, "concat: tensor ", i, " ", describe(x), " does not match tensor 0 ",
                  describe(first), " outside dimension ", dim);
    offsets.push_back(shape[d]);
    lengths.push_back(x.shape()[d]);
    shape[d] += x.shape()[d];
  }
  Tensor y = Tensor::empty(shape, first.dtype(), first.device());
  Backend& backend = backend_for(first.device());
  for (size_t i = 0; i < xs.size(); ++i)
    backend.copy_narrow(xs[i], d, 0, y, offsets[i], lengths[i]);
  if (auto node = make_node<ConcatBackward>(xs)) {
    node->dim = d;
    node->offsets = std::move(offsets);
    node->lengths = std::move(lengths);
    attach_output(node, y);
  }
  return y;
}

}  // namespace mixprec::ops
