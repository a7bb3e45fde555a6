// sum and mean, over every element or over chosen dims. Both are Backend::sum_to into the
// kept-dims shape (FP32 accumulation, the 1/count of mean folded into its scale, one
// rounding); the backward broadcasts the gradient back with Backend::expand.
#include <algorithm>
#include <string>

#include "core/autograd/record.h"
#include "core/backend.h"
#include "core/ops/checks.h"
#include "core/ops/dims.h"
#include "core/ops/ops.h"
#include "core/ops/view.h"

namespace mixprec::ops {
namespace {

struct ReduceBackward final : Node {
  const char* op = "sum";
  Shape input_shape;
  Shape kept_shape;  // the output's shape with the reduced dims kept as 1
  float scale = 1.0f;
  std::string name() const override { return op; }
  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    Tensor gx = Tensor::empty(input_shape, g.dtype(), g.device());
    backend_for(g.device()).expand(view_as_shape(g, kept_shape), gx, scale);
    return {gx};
  }
};

// Reduces x to `kept_shape` (x's shape with 1s on the reduced dims, or [] for all) and
// returns the result with `out_shape` (equal numel).
Tensor reduce(const char* op, const Tensor& x, const Shape& kept_shape, const Shape& out_shape,
              float scale) {
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  Tensor kept = view_as_shape(out, kept_shape);
  backend_for(x.device()).sum_to(x, kept, scale);
  if (auto node = make_node<ReduceBackward>({&x})) {
    node->op = op;
    node->input_shape = x.shape();
    node->kept_shape = kept_shape;
    node->scale = scale;
    attach_output(node, out);
  }
  check_forward(op, out);
  return out;
}

Tensor reduce_all(const char* op, const Tensor& x, bool mean) {
  check_floating(op, x);
  const float scale = mean ? static_cast<float>(1.0 / static_cast<double>(x.numel())) : 1.0f;
  return reduce(op, x, Shape{}, Shape{}, scale);
}

Tensor reduce_dims(const char* op, const Tensor& x, const std::vector<int64_t>& dims,
                   bool keepdim, bool mean) {
  check_floating(op, x);
  MIXPREC_CHECK(!dims.empty(), op, ": no dimensions given for ", describe(x),
                " (call ", op, "(x) to reduce every element)");
  std::vector<bool> reduced(x.dim(), false);
  for (int64_t d : normalize_dims(op, dims, x)) reduced[d] = true;
  Shape kept_shape, out_shape;
  int64_t count = 1;
  for (int64_t d = 0; d < x.dim(); ++d) {
    const int64_t extent = x.shape()[d];
    kept_shape.push_back(reduced[d] ? 1 : extent);
    if (reduced[d]) count *= extent;
    if (!reduced[d] || keepdim) out_shape.push_back(reduced[d] ? 1 : extent);
  }
  const float scale = mean ? static_cast<float>(1.0 / static_cast<double>(count)) : 1.0f;
  return reduce(op, x, kept_shape, out_shape, scale);
}

}  // namespace

Tensor sum(const Tensor& x) { return reduce_all("sum", x, false); }
Tensor mean(const Tensor& x) { return reduce_all("mean", x, true); }

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce_dims("sum", x, dims, keepdim, false);
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce_dims("mean", x, dims, keepdim, true);
}

}  // namespace mixprec::ops
