// batch_norm2d over NCHW with per-channel statistics. Training normalises with the batch's
// biased variance and updates the F32 running statistics in place (unbiased variance,
// running = (1 - momentum) * running + momentum * batch, as PyTorch); eval normalises with
// the running statistics. The backward covers both modes: in eval the statistics are
// constants, so dx is a per-channel scaling of dy. With relu fused, the backward passes dy
// through relu's derivative at the forward output, which the backend recomputes from x and
// the saved bias rather than keeping the output alive.
#include <cmath>

#include "core/autograd/record.h"
#include "core/backend.h"
#include "core/ops/checks.h"
#include "core/ops/ops.h"

namespace mixprec::ops {
namespace {

struct BatchNormBackward final : Node {
  Tensor x, weight, save_mean, save_invstd;
  Tensor relu_bias;  // defined when relu is fused
  bool training = true;
  std::string name() const override {
    return relu_bias.defined() ? "batch_norm2d_relu" : "batch_norm2d";
  }
  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    const int64_t c = x.size(1);
    Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
    Tensor dweight = Tensor::empty({c}, x.dtype(), x.device());
    Tensor dbias = Tensor::empty({c}, x.dtype(), x.device());
    backend_for(x.device()).batch_norm_backward(x, weight, save_mean, save_invstd, grads[0],
                                                training,
                                                relu_bias.defined() ? &relu_bias : nullptr, dx,
                                                dweight, dbias);
    return {dx, dweight, dbias};
  }
  void release_saved() override {
    x = Tensor();
    weight = Tensor();
    save_mean = Tensor();
    save_invstd = Tensor();
    relu_bias = Tensor();
  }
};

void check_param(const Tensor& x, const Tensor& p, const char* what) {
  MIXPREC_CHECK(p.defined(), "batch_norm2d: ", what, " is an undefined tensor");
  check_floating("batch_norm2d", p);
  MIXPREC_CHECK(p.dim() == 1 && p.size(0) == x.size(1), "batch_norm2d: ", what, " ",
                describe(p), " must be [", x.size(1), "] for ", describe(x));
}

void check_running(const Tensor& x, const Tensor& r, const char* what) {
  MIXPREC_CHECK(r.defined(), "batch_norm2d: ", what, " is an undefined tensor");
  MIXPREC_CHECK(r.dtype() == DType::F32 && r.dim() == 1 && r.size(0) == x.size(1),
                "batch_norm2d: ", what, " must be F32[", x.size(1), "], got ", describe(r));
  MIXPREC_CHECK(r.device() == x.device(), "batch_norm2d: ", what, " ", describe(r),
                " is on another device than ", describe(x));
}

}  // namespace

Tensor batch_norm2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
                    Tensor& running_mean, Tensor& running_var, bool training, double momentum,
                    double eps, bool relu) {
  check_floating("batch_norm2d", x);
  check_rank("batch_norm2d", x, 4, "x (NCHW)");
  check_param(x, weight, "weight");
  check_param(x, bias, "bias");
  check_same_dtype_device("batch_norm2d", {&x, &weight, &bias});
  check_running(x, running_mean, "running_mean");
  check_running(x, running_var, "running_var");
  MIXPREC_CHECK(std::isfinite(eps) && eps >= 0.0, "batch_norm2d: eps must be finite and >= 0, got ",
                eps);
  MIXPREC_CHECK(momentum >= 0.0 && momentum <= 1.0, "batch_norm2d: momentum must be in [0, 1], got ",
                momentum);
  MIXPREC_CHECK(!training || x.numel() / x.size(1) > 1, "batch_norm2d: training needs more than "
                "one value per channel, got ", describe(x));

  const int64_t c = x.size(1);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor save_mean = Tensor::empty({c}, DType::F32, x.device());
  Tensor save_invstd = Tensor::empty({c}, DType::F32, x.device());
  backend_for(x.device()).batch_norm(x, weight, bias, running_mean, running_var, training,
                                     static_cast<float>(momentum), static_cast<float>(eps), relu, y,
                                     save_mean, save_invstd);
  if (training) {  // the caller's running statistics were written in place
    running_mean.mark_modified();
    running_var.mark_modified();
  }
  if (auto node = make_node<BatchNormBackward>({&x, &weight, &bias})) {
    node->x = save_for_backward(*node, x);
    node->weight = save_for_backward(*node, weight);
    if (relu) node->relu_bias = save_for_backward(*node, bias);
    node->save_mean = save_mean;
    node->save_invstd = save_invstd;
    node->training = training;
    attach_output(node, y);
  }
  check_forward("batch_norm2d", y);
  return y;
}

}  // namespace mixprec::ops
