// cast: converts between dtypes, rounding once (RNE). Its gradient is the incoming gradient
// cast back to the input's dtype, which is how FP16 working weights pass gradients to FP32
// masters.
#include "core/autograd/record.h"
#include "core/backend.h"
#include "core/ops/ops.h"

namespace mixprec::ops {
namespace {

struct CastBackward final : Node {
  DType input_dtype = DType::F32;
  std::string name() const override { return "cast"; }
  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    Tensor gx = Tensor::empty(g.shape(), input_dtype, g.device());
    if (g.numel() > 0) backend_for(g.device()).cast(g, gx);
    return {gx};
  }
};

}  // namespace

Tensor cast(const Tensor& x, DType dtype) {
  MIXPREC_CHECK(x.defined(), "cast: input is an undefined tensor");
  if (x.dtype() == dtype) return x;
  MIXPREC_CHECK(!x.requires_grad() || !grad_enabled() || is_floating(dtype),
                "cast: cannot cast ", describe(x), " that requires grad to ", dtype,
                " (gradients cannot flow through integers; detach() first)");
  Tensor y = Tensor::empty(x.shape(), dtype, x.device());
  if (x.numel() > 0) backend_for(x.device()).cast(x, y);
  if (auto node = make_node<CastBackward>({&x})) {
    node->input_dtype = x.dtype();
    attach_output(node, y);
  }
  check_forward("cast", y);
  return y;
}

}  // namespace mixprec::ops
