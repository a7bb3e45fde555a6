// mse_loss: mean((a - b)^2) over all elements as an F32 scalar. Both inputs are widened to
// FP32 first, so the difference and its square are never rounded to F16/BF16; the FP32
// difference is kept for the backward, da = 2 / n * dloss * (a - b) and db = -da.
#include "core/autograd/record.h"
#include "core/backend.h"
#include "core/ops/checks.h"
#include "core/ops/ops.h"
#include "core/ops/view.h"

namespace mixprec::ops {
namespace {

struct MseLossBackward final : Node {
  Tensor diff;  // F32 a - b
  DType input_dtype = DType::F32;
  std::string name() const override { return "mse_loss"; }

  // alpha * g computed in FP32, rounded once to the inputs' dtype.
  Tensor scaled(const Tensor& g, float alpha) const {
    Tensor f32 = Tensor::empty(diff.shape(), DType::F32, diff.device());
    backend_for(diff.device()).affine(g, alpha, 0.0f, f32);
    return cast_untracked(f32, input_dtype);
  }

  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    Backend& be = backend_for(diff.device());
    const Tensor& dloss = grads[0];  // F32, like the loss
    // dloss stays on the device (a broadcast multiply, not item()): no host round-trip.
    Tensor g = Tensor::empty(diff.shape(), DType::F32, diff.device());
    be.binary(BinaryOp::Mul, diff, dloss, g);
    const float two_over_n = 2.0f / static_cast<float>(diff.numel());
    const bool need_a = next_edges[0].valid(), need_b = next_edges[1].valid();
    return {need_a ? scaled(g, two_over_n) : Tensor(), need_b ? scaled(g, -two_over_n) : Tensor()};
  }
  void release_saved() override { diff = Tensor(); }
};

}  // namespace

Tensor mse_loss(const Tensor& a, const Tensor& b) {
  check_floating("mse_loss", a);
  check_floating("mse_loss", b);
  check_same_dtype_device("mse_loss", {&a, &b});
  MIXPREC_CHECK(a.shape() == b.shape(), "mse_loss: shapes of ", describe(a), " and ", describe(b),
                " differ (mse_loss does not broadcast)");
  Backend& be = backend_for(a.device());
  Tensor diff = Tensor::empty(a.shape(), DType::F32, a.device());
  be.binary(BinaryOp::Sub, cast_untracked(a, DType::F32), cast_untracked(b, DType::F32),
            diff);
  Tensor squared = Tensor::empty(a.shape(), DType::F32, a.device());
  be.unary(UnaryOp::Square, diff, squared);
  Tensor loss = Tensor::empty({}, DType::F32, a.device());
  be.sum_to(squared, loss, 1.0f / static_cast<float>(a.numel()));
  if (auto node = make_node<MseLossBackward>({&a, &b})) {
    node->diff = diff;
    node->input_dtype = a.dtype();
    attach_output(node, loss);
  }
  check_forward("mse_loss", loss);
  return loss;
}

}  // namespace mixprec::ops
