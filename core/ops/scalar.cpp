// add_scalar, mul_scalar and neg: y = alpha * x + beta through Backend::affine. The scalar is
// applied in FP32 (so a scalar that F16 cannot represent still acts exactly on F32 inputs),
// and the gradient is alpha * g.
#include "core/autograd/record.h"
#include "core/backend.h"
#include "core/ops/checks.h"
#include "core/ops/ops.h"

namespace mixprec::ops {
namespace {

struct AffineBackward final : Node {
  const char* op = "affine";
  float alpha = 1.0f;
  std::string name() const override { return op; }
  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    if (alpha == 1.0f) return {g};
    Tensor gx = Tensor::empty(g.shape(), g.dtype(), g.device());
    backend_for(g.device()).affine(g, alpha, 0.0f, gx);
    return {gx};
  }
};

Tensor affine_op(const char* op, const Tensor& x, float alpha, float beta) {
  check_floating(op, x);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  backend_for(x.device()).affine(x, alpha, beta, y);
  if (auto node = make_node<AffineBackward>({&x})) {
    node->op = op;
    node->alpha = alpha;
    attach_output(node, y);
  }
  check_forward(op, y);
  return y;
}

}  // namespace

Tensor add_scalar(const Tensor& x, double s) {
  return affine_op("add_scalar", x, 1.0f, static_cast<float>(s));
}

Tensor mul_scalar(const Tensor& x, double s) {
  return affine_op("mul_scalar", x, static_cast<float>(s), 0.0f);
}

Tensor neg(const Tensor& x) { return affine_op("neg", x, -1.0f, 0.0f); }

}  // namespace mixprec::ops
