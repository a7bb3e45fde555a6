// add, sub, mul, div with NumPy broadcasting. The backward computes each input's gradient at
// the output's shape and reduces it to the input's shape with sum_to, whose scale also
// carries the sign of sub's and div's second gradient.
#include <algorithm>

#include "core/autograd/record.h"
#include "core/backend.h"
#include "core/ops/checks.h"
#include "core/ops/ops.h"

namespace mixprec::ops {
namespace {

const char* op_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add: return "add";
    case BinaryOp::Sub: return "sub";
    case BinaryOp::Mul: return "mul";
    case BinaryOp::Div: return "div";
  }
  return "binary";
}

// scale * g summed down to `shape` (g itself when nothing is to be done).
Tensor reduce_to(const Tensor& g, const Shape& shape, float scale) {
  if (g.shape() == shape && scale == 1.0f) return g;
  Tensor out = Tensor::empty(shape, g.dtype(), g.device());
  backend_for(g.device()).sum_to(g, out, scale);
  return out;
}

Tensor apply_binary(BinaryOp op, const Tensor& a, const Tensor& b, const Shape& shape) {
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  backend_for(a.device()).binary(op, a, b, out);
  return out;
}

struct BinaryBackward final : Node {
  BinaryOp op = BinaryOp::Add;
  Shape a_shape, b_shape;
  Tensor a, b;  // saved for mul (the other operand) and div (both)
  std::string name() const override { return op_name(op); }
  void release_saved() override {
    a = Tensor();
    b = Tensor();
  }
  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    const bool need_a = next_edges[0].valid(), need_b = next_edges[1].valid();
    Tensor ga, gb;
    switch (op) {
      case BinaryOp::Add:
        if (need_a) ga = reduce_to(g, a_shape, 1.0f);
        if (need_b) gb = reduce_to(g, b_shape, 1.0f);
        break;
      case BinaryOp::Sub:
        if (need_a) ga = reduce_to(g, a_shape, 1.0f);
        if (need_b) gb = reduce_to(g, b_shape, -1.0f);
        break;
      case BinaryOp::Mul:
        if (need_a) ga = reduce_to(apply_binary(BinaryOp::Mul, g, b, g.shape()), a_shape, 1.0f);
        if (need_b) gb = reduce_to(apply_binary(BinaryOp::Mul, g, a, g.shape()), b_shape, 1.0f);
        break;
      case BinaryOp::Div: {
        // da = g / b; db = -(g / b) * a / b, reusing g / b.
        const Tensor g_over_b = apply_binary(BinaryOp::Div, g, b, g.shape());
        if (need_a) ga = reduce_to(g_over_b, a_shape, 1.0f);
        if (need_b) {
          Tensor t = apply_binary(BinaryOp::Mul, g_over_b, a, g.shape());
          t = apply_binary(BinaryOp::Div, t, b, g.shape());
          gb = reduce_to(t, b_shape, -1.0f);
        }
        break;
      }
    }
    return {ga, gb};
  }
};

Tensor binary_op(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = op_name(op);
  check_floating(name, a);
  check_floating(name, b);
  check_same_dtype_device(name, {&a, &b});
  const Shape& sa = a.shape();
  const Shape& sb = b.shape();
  for (size_t i = 1; i <= std::min(sa.size(), sb.size()); ++i) {
    const int64_t da = sa[sa.size() - i], db = sb[sb.size() - i];
    MIXPREC_CHECK(da == db || da == 1 || db == 1, name, ": ", describe(a), " and ", describe(b),
                  " cannot be broadcast together (extents ", da, " and ", db, " in dimension -",
                  i, ")");
  }
  const Shape shape = broadcast_shapes(sa, sb, name);
  Tensor out = apply_binary(op, a, b, shape);
  if (auto node = make_node<BinaryBackward>({&a, &b})) {
    node->op = op;
    node->a_shape = a.shape();
    node->b_shape = b.shape();
    // mul needs each operand for the other's gradient; div needs b for both and a for b's.
    const bool need_a = node->next_edges[0].valid(), need_b = node->next_edges[1].valid();
    if (op == BinaryOp::Mul) {
      if (need_b) node->a = a.detach();
      if (need_a) node->b = b.detach();
    } else if (op == BinaryOp::Div) {
      if (need_b) node->a = a.detach();
      node->b = b.detach();
    }
    attach_output(node, out);
  }
  check_forward(name, out);
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::Add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::Sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::Mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::Div, a, b); }

}  // namespace mixprec::ops
