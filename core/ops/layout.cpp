// transpose, permute, concat, split and slice. Tensors are always contiguous, so each of
// these moves data: permute through Backend::permute, the others through
// Backend::copy_narrow, which also writes their gradients back into place. They move whole
// elements, so every dtype works (I32 ids included); only floating tensors carry gradients.
#include <string>
#include <vector>

#include "core/autograd/grad_mode.h"
#include "core/autograd/record.h"
#include "core/backend.h"
#include "core/ops/checks.h"
#include "core/ops/ops.h"

namespace mixprec::ops {
namespace {

void check_input(const char* op, const Tensor& x) {
  MIXPREC_CHECK(x.defined(), op, ": input is an undefined tensor");
  MIXPREC_CHECK(x.numel() > 0, op, ": input ", describe(x), " is empty");
}

// `dim` wrapped into [0, x.dim()); negative counts from the end.
int64_t wrap_dim(const char* op, int64_t dim, const Tensor& x) {
  MIXPREC_CHECK(dim >= -x.dim() && dim < x.dim(), op, ": dimension ", dim,
                " is out of range for ", describe(x));
  return dim < 0 ? dim + x.dim() : dim;
}

// make_node for a variable number of inputs.
template <class NodeT>
std::shared_ptr<NodeT> make_node_for(const std::vector<Tensor>& inputs) {
  if (!grad_enabled()) return nullptr;
  bool any = false;
  for (const Tensor& t : inputs) any = any || t.requires_grad();
  if (!any) return nullptr;
  auto node = std::make_shared<NodeT>();
  node->next_edges.reserve(inputs.size());
  for (const Tensor& t : inputs) node->next_edges.push_back(gradient_edge(t));
  node->layer = current_layer_name();
  return node;
}

// x with `piece` (same shape except along `dim`) copied out of it starting at `start`.
Tensor narrow_copy(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  Shape shape = x.shape();
  shape[dim] = length;
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  backend_for(x.device()).copy_narrow(x, dim, start, out, 0, length, false);
  return out;
}

// ---- permute / transpose --------------------------------------------------------------

Tensor permute_impl(const char* op, const Tensor& x, const std::vector<int64_t>& perm);

struct PermuteBackward final : Node {
  const char* op = "permute";
  std::vector<int64_t> inverse;
  std::string name() const override { return op; }
  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    return {permute_impl(op, grads[0], inverse)};
  }
};

// `perm` is already validated and non-negative.
Tensor permute_impl(const char* op, const Tensor& x, const std::vector<int64_t>& perm) {
  Shape shape(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) shape[i] = x.shape()[perm[i]];
  Tensor y = Tensor::empty(shape, x.dtype(), x.device());
  backend_for(x.device()).permute(x, perm, y);
  if (auto node = make_node<PermuteBackward>({&x})) {
    node->op = op;
    node->inverse.resize(perm.size());
    for (size_t i = 0; i < perm.size(); ++i) node->inverse[perm[i]] = static_cast<int64_t>(i);
    attach_output(node, y);
  }
  return y;
}

// ---- concat ------------------------------------------------------------------------------

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

// ---- split / slice -------------------------------------------------------------------------

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
      backend.copy_narrow(grads[i], dim, 0, gx, offsets[i], lengths[i], false);
    return {gx};
  }
};

struct SliceBackward final : Node {
  Shape input_shape;
  int64_t dim = 0, start = 0, length = 0;
  std::string name() const override { return "slice"; }
  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    Tensor gx = Tensor::zeros(input_shape, g.dtype(), g.device());
    backend_for(g.device()).copy_narrow(g, dim, 0, gx, start, length, false);
    return {gx};
  }
};

}  // namespace

Tensor permute(const Tensor& x, const std::vector<int64_t>& perm) {
  check_input("permute", x);
  MIXPREC_CHECK(static_cast<int64_t>(perm.size()) == x.dim(), "permute: ", shape_str(perm),
                " has ", perm.size(), " entries but ", describe(x), " has ", x.dim(),
                " dimensions");
  std::vector<int64_t> wrapped(perm.size());
  std::vector<bool> seen(perm.size(), false);
  for (size_t i = 0; i < perm.size(); ++i) {
    wrapped[i] = wrap_dim("permute", perm[i], x);
    MIXPREC_CHECK(!seen[wrapped[i]], "permute: dimension ", perm[i], " appears more than once in ",
                  shape_str(perm), " for ", describe(x));
    seen[wrapped[i]] = true;
  }
  return permute_impl("permute", x, wrapped);
}

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  check_input("transpose", x);
  const int64_t d0 = wrap_dim("transpose", dim0, x);
  const int64_t d1 = wrap_dim("transpose", dim1, x);
  std::vector<int64_t> perm(x.dim());
  for (int64_t i = 0; i < x.dim(); ++i) perm[i] = i;
  std::swap(perm[d0], perm[d1]);
  return permute_impl("transpose", x, perm);
}

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
                  "concat: tensor ", i, " ", describe(x), " does not match the dtype and device of tensor 0 ",
                  describe(first), " (convert explicitly with .to(dtype))");
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
    backend.copy_narrow(xs[i], d, 0, y, offsets[i], lengths[i], false);
  if (auto node = make_node_for<ConcatBackward>(xs)) {
    node->dim = d;
    node->offsets = std::move(offsets);
    node->lengths = std::move(lengths);
    attach_output(node, y);
  }
  return y;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  check_input("split", x);
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

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end) {
  check_input("slice", x);
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
