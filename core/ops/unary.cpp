// exp, log, sqrt, square, relu, gelu, sigmoid, tanh: one forward and one backward node,
// parameterised by UnaryOp. The math (and which of x or y = f(x) the derivative reads) is in
// core/math/elementwise.h; only what the derivative reads is kept for backward.
#include "core/autograd/record.h"
#include "core/backend.h"
#include "core/math/elementwise.h"
#include "core/ops/checks.h"
#include "core/ops/ops.h"

namespace mixprec::ops {
namespace {

const char* op_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::Exp: return "exp";
    case UnaryOp::Log: return "log";
    case UnaryOp::Sqrt: return "sqrt";
    case UnaryOp::Square: return "square";
    case UnaryOp::Relu: return "relu";
    case UnaryOp::Gelu: return "gelu";
    case UnaryOp::Sigmoid: return "sigmoid";
    case UnaryOp::Tanh: return "tanh";
  }
  return "unary";
}

struct UnaryBackward final : Node {
  UnaryOp op = UnaryOp::Relu;
  Tensor x, y;  // only the one the derivative reads is defined
  std::string name() const override { return op_name(op); }
  void release_saved() override {
    x = Tensor();
    y = Tensor();
  }
  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    // The backend reads only what the op needs; the other argument is a same-shape stand-in.
    const Tensor& in = x.defined() ? x : y;
    const Tensor& out = y.defined() ? y : x;
    Tensor gx = Tensor::empty(g.shape(), g.dtype(), g.device());
    backend_for(g.device()).unary_backward(op, in, out, g, gx);
    return {gx};
  }
};

Tensor unary_op(UnaryOp op, const Tensor& x) {
  const char* name = op_name(op);
  check_floating(name, x);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  backend_for(x.device()).unary(op, x, y);
  if (auto node = make_node<UnaryBackward>({&x})) {
    node->op = op;
    if (unary_grad_reads_output(op)) node->y = save_for_backward(*node, y);
    else node->x = save_for_backward(*node, x);
    attach_output(node, y);
  }
  check_forward(name, y);
  return y;
}

}  // namespace

Tensor exp(const Tensor& x) { return unary_op(UnaryOp::Exp, x); }
Tensor log(const Tensor& x) { return unary_op(UnaryOp::Log, x); }
Tensor sqrt(const Tensor& x) { return unary_op(UnaryOp::Sqrt, x); }
Tensor square(const Tensor& x) { return unary_op(UnaryOp::Square, x); }
Tensor relu(const Tensor& x) { return unary_op(UnaryOp::Relu, x); }
Tensor gelu(const Tensor& x) { return unary_op(UnaryOp::Gelu, x); }
Tensor sigmoid(const Tensor& x) { return unary_op(UnaryOp::Sigmoid, x); }
Tensor tanh(const Tensor& x) { return unary_op(UnaryOp::Tanh, x); }

}  // namespace mixprec::ops
