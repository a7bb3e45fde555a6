// layer_norm over the last dim: y = (x - mean) / sqrt(var + eps) * weight + bias, with the
// biased variance, FP32 statistics (kept for the backward) and one rounding on store.
#include <cmath>

#include "core/autograd/record.h"
#include "core/backend.h"
#include "core/ops/checks.h"
#include "core/ops/ops.h"

namespace mixprec::ops {
namespace {

struct LayerNormBackward final : Node {
  Tensor x, weight, mean, rstd;
  std::string name() const override { return "layer_norm"; }
  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
    // Only the parameters that receive a gradient (not absent, not frozen) get one.
    Tensor dweight, dbias;
    const int64_t d = x.size(-1);
    if (next_edges[1].valid()) dweight = Tensor::empty({d}, x.dtype(), x.device());
    if (next_edges[2].valid()) dbias = Tensor::empty({d}, x.dtype(), x.device());
    backend_for(x.device()).layer_norm_backward(x, weight.defined() ? &weight : nullptr, mean,
                                                rstd, grads[0], dx,
                                                dweight.defined() ? &dweight : nullptr,
                                                dbias.defined() ? &dbias : nullptr);
    return {dx, dweight, dbias};
  }
  void release_saved() override {
    x = Tensor();
    weight = Tensor();
    mean = Tensor();
    rstd = Tensor();
  }
};

void check_param(const Tensor& x, const Tensor& p, const char* what) {
  if (!p.defined()) return;
  check_floating("layer_norm", p);
  MIXPREC_CHECK(p.dim() == 1 && p.size(0) == x.size(-1), "layer_norm: ", what, " ", describe(p),
                " must be [", x.size(-1), "] to match the last dim of ", describe(x));
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  check_floating("layer_norm", x);
  MIXPREC_CHECK(x.dim() >= 1, "layer_norm: expected at least one dimension, got ", describe(x));
  check_param(x, weight, "weight");
  check_param(x, bias, "bias");
  check_same_dtype_device("layer_norm", {&x, &weight, &bias});
  MIXPREC_CHECK(std::isfinite(eps) && eps >= 0.0, "layer_norm: eps must be finite and >= 0, got ",
                eps);

  const int64_t rows = x.numel() / x.size(-1);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor mean = Tensor::empty({rows}, DType::F32, x.device());
  Tensor rstd = Tensor::empty({rows}, DType::F32, x.device());
  backend_for(x.device()).layer_norm(x, weight.defined() ? &weight : nullptr,
                                     bias.defined() ? &bias : nullptr, static_cast<float>(eps), y,
                                     mean, rstd);
  if (auto node = make_node<LayerNormBackward>({&x, &weight, &bias})) {
    node->x = save_for_backward(*node, x);
    if (weight.defined()) node->weight = save_for_backward(*node, weight);
    node->mean = mean;
    node->rstd = rstd;
    attach_output(node, y);
  }
  check_forward("layer_norm", y);
  return y;
}

}  // namespace mixprec::ops
