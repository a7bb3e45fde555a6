// softmax and log_softmax over the last dim. The math is FP32 (core/math/softmax.h); the
// output keeps x's dtype. The backward needs only the output, which is saved.
#include "core/autograd/record.h"
#include "core/backend.h"
#include "core/ops/checks.h"
#include "core/ops/ops.h"

namespace mixprec::ops {
namespace {

struct SoftmaxBackward final : Node {
  Tensor y;
  bool log = false;
  std::string name() const override { return log ? "log_softmax" : "softmax"; }
  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    Tensor dx = Tensor::empty(y.shape(), y.dtype(), y.device());
    backend_for(y.device()).softmax_backward(y, grads[0], dx, log);
    return {dx};
  }
  void release_saved() override { y = Tensor(); }
};

Tensor softmax_impl(const Tensor& x, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  check_floating(op, x);
  MIXPREC_CHECK(x.dim() >= 1, op, ": expected at least one dimension, got ", describe(x));
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  backend_for(x.device()).softmax(x, y, log);
  if (auto node = make_node<SoftmaxBackward>({&x})) {
    node->y = save_for_backward(*node, y);
    node->log = log;
    attach_output(node, y);
  }
  check_forward(op, y);
  return y;
}

}  // namespace

Tensor softmax(const Tensor& x) { return softmax_impl(x, false); }

Tensor log_softmax(const Tensor& x) { return softmax_impl(x, true); }

}  // namespace mixprec::ops
