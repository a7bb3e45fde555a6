// add, sub, mul, div with NumPy broadcasting. The backward computes each input's gradient at
// the output's shape and reduces it to the input's shape with sum_to, whose scale also
// carries the sign of sub's and div's second gradient. Mul's and div's gradients of F16/BF16
// inputs are computed in FP32 and rounded once (see product_grads).
#include "core/autograd/record.h"
#include "core/backend.h"
#include "core/ops/checks.h"
#include "core/ops/ops.h"
#include "core/ops/view.h"

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
      case BinaryOp::Div:
        product_grads(g, need_a, need_b, ga, gb);
        break;
    }
    return {ga, gb};
  }

  // Gradients of mul and div. For F16/BF16 the products and quotients of g with the
  // operands are formed in FP32 (g and the operands widened once), summed down to the
  // input's shape in FP32 and rounded once to the input dtype: rounding each step would
  // lose bits, and an intermediate such as g / b can overflow the 16-bit range when the
  // gradient itself does not, a false overflow that makes the loss scaler skip the step.
  void product_grads(const Tensor& g, bool need_a, bool need_b, Tensor& ga, Tensor& gb) const {
    const DType dtype = g.dtype();
    const Tensor g32 = cast_untracked(g, DType::F32);
    if (op == BinaryOp::Mul) {
      if (need_a) {
        const Tensor b32 = cast_untracked(b, DType::F32);
        ga = reduce_to(apply_binary(BinaryOp::Mul, g32, b32, g.shape()), a_shape, 1.0f);
      }
      if (need_b) {
        const Tensor a32 = cast_untracked(a, DType::F32);
        gb = reduce_to(apply_binary(BinaryOp::Mul, g32, a32, g.shape()), b_shape, 1.0f);
      }
    } else {
      // da = g / b; db = -(g / b) * a / b, reusing g / b.
      const Tensor b32 = cast_untracked(b, DType::F32);
      const Tensor g_over_b = apply_binary(BinaryOp::Div, g32, b32, g.shape());
      if (need_a) ga = reduce_to(g_over_b, a_shape, 1.0f);
      if (need_b) {
        Tensor t = apply_binary(BinaryOp::Mul, g_over_b, cast_untracked(a, DType::F32), g.shape());
        t = apply_binary(BinaryOp::Div, t, b32, g.shape());
        gb = reduce_to(t, b_shape, -1.0f);
      }
    }
    if (ga.defined()) ga = cast_untracked(ga, dtype);
    if (gb.defined()) gb = cast_untracked(gb, dtype);
  }
};

Tensor binary_op(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = op_name(op);
  check_floating(name, a);
  check_floating(name, b);
  check_same_dtype_device(name, {&a, &b});
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = apply_binary(op, a, b, shape);
  if (auto node = make_node<BinaryBackward>({&a, &b})) {
    node->op = op;
    node->a_shape = a.shape();
    node->b_shape = b.shape();
    // mul needs each operand for the other's gradient; div needs b for both and a for b's.
    const bool need_a = node->next_edges[0].valid(), need_b = node->next_edges[1].valid();
    if (op == BinaryOp::Mul) {
      if (need_b) node->a = save_for_backward(*node, a);
      if (need_a) node->b = save_for_backward(*node, b);
    } else if (op == BinaryOp::Div) {
      if (need_b) node->a = save_for_backward(*node, a);
      node->b = save_for_backward(*node, b);
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
