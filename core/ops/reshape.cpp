// reshape and flatten: new shapes over the same storage (tensors are contiguous, so no data
// moves); the gradient is reshaped back.
#include "core/autograd/record.h"
#include "core/ops/ops.h"
#include "core/ops/view.h"

namespace mixprec::ops {
namespace {

struct ReshapeBackward final : Node {
  Shape input_shape;
  std::string name() const override { return "reshape"; }
  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    return {view_as_shape(grads[0], input_shape)};
  }
};

Shape resolve_shape(const Tensor& x, Shape shape) {
  int64_t inferred = -1, known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      MIXPREC_CHECK(inferred < 0, "reshape: only one extent may be -1, got ", shape_str(shape));
      inferred = static_cast<int64_t>(i);
    } else {
      MIXPREC_CHECK(shape[i] >= 0, "reshape: invalid extent in ", shape_str(shape));
      known *= shape[i];
    }
  }
  if (inferred >= 0) {
    MIXPREC_CHECK(known > 0 && x.numel() % known == 0, "reshape: cannot reshape ", describe(x),
                  " to ", shape_str(shape));
    shape[inferred] = x.numel() / known;
  }
  MIXPREC_CHECK(shape_numel(shape) == x.numel(), "reshape: cannot reshape ", describe(x), " (",
                x.numel(), " elements) to ", shape_str(shape));
  return shape;
}

}  // namespace

Tensor reshape(const Tensor& x, const Shape& shape) {
  MIXPREC_CHECK(x.defined(), "reshape: input is an undefined tensor");
  const Shape target = resolve_shape(x, shape);
  Tensor y = view_as_shape(x, target);
  if (auto node = make_node<ReshapeBackward>({&x})) {
    node->input_shape = x.shape();
    attach_output(node, y);
  }
  return y;
}

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  MIXPREC_CHECK(x.defined(), "flatten: input is an undefined tensor");
  if (x.dim() == 0) return reshape(x, {1});
  const int64_t start = normalize_dim(start_dim, x.dim(), "flatten");
  const int64_t end = normalize_dim(end_dim, x.dim(), "flatten");
  MIXPREC_CHECK(start <= end, "flatten: start_dim ", start_dim, " comes after end_dim ", end_dim,
                " for ", describe(x));
  Shape shape(x.shape().begin(), x.shape().begin() + start);
  int64_t merged = 1;
  for (int64_t d = start; d <= end; ++d) merged *= x.shape()[d];
  shape.push_back(merged);
  shape.insert(shape.end(), x.shape().begin() + end + 1, x.shape().end());
  return reshape(x, shape);
}

}  // namespace mixprec::ops
