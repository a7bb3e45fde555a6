// linear: y = x @ W^T + b over the last dim of x, as GEMMs on the flattened rows of x
// (X is M x in, M = product of the leading dims); linear_gelu: gelu(linear(x)) in one GEMM.
//
// The bias is the GEMM's epilogue (Backend::gemm_epilogue): added to the FP32 sums before
// y's one rounding. linear_gelu's epilogue also applies gelu to the unrounded sum and keeps
// that sum, rounded once, for gelu's backward, which then feeds linear's. The bias gradient
// is G summed over the rows with FP32 accumulation (sum_to).
#include "core/autograd/record.h"
#include "core/backend.h"
#include "core/ops/checks.h"
#include "core/ops/gemm_desc.h"
#include "core/ops/ops.h"

namespace mixprec::ops {
namespace {

void run_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float beta,
              const Tensor& a, const Tensor& b, Tensor& c) {
  backend_for(c.device()).gemm(gemm_desc(trans_a, trans_b, m, n, k, 1.0f, beta), a, b, c);
}

struct LinearBackward final : Node {
  Tensor x, weight;
  Tensor pre_gelu;  // linear_gelu's: the (biased) sums that gelu was applied to
  bool gelu = false;
  int64_t rows = 0;
  std::string name() const override { return gelu ? "linear_gelu" : "linear"; }

  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    Tensor g = grads[0];
    if (gelu) {
      Tensor g_pre = Tensor::empty(pre_gelu.shape(), pre_gelu.dtype(), pre_gelu.device());
      // gelu's derivative reads only its input, which stands in for the unused output too.
      backend_for(g.device()).unary_backward(UnaryOp::Gelu, pre_gelu, pre_gelu, g, g_pre);
      g = g_pre;
    }
    const int64_t out = weight.size(0), in = weight.size(1);
    Tensor gx, gw, gb;
    if (next_edges[0].valid()) {
      gx = Tensor::empty(x.shape(), x.dtype(), x.device());
      run_gemm(false, false, rows, in, out, 0.0f, g, weight, gx);  // G (M x out) @ W
    }
    if (next_edges[1].valid()) {
      gw = Tensor::empty(weight.shape(), weight.dtype(), weight.device());
      run_gemm(true, false, out, in, rows, 0.0f, g, x, gw);  // G^T @ X
    }
    if (next_edges[2].valid()) {
      gb = Tensor::empty({out}, g.dtype(), g.device());
      backend_for(g.device()).sum_to(g, gb, 1.0f);
    }
    return {gx, gw, gb};
  }

  void release_saved() override {
    x = Tensor();
    weight = Tensor();
    pre_gelu = Tensor();
  }
};

Tensor linear_forward(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias,
                      bool gelu) {
  check_floating(op, x);
  check_floating(op, weight);
  if (bias.defined()) check_floating(op, bias);
  check_same_dtype_device(op, {&x, &weight, &bias});
  MIXPREC_CHECK(x.dim() >= 1, op, ": input must have at least 1 dimension, got ", describe(x));
  MIXPREC_CHECK(weight.dim() == 2, op, ": weight must be 2-D [out, in], got ", describe(weight));
  const int64_t out = weight.size(0), in = weight.size(1);
  MIXPREC_CHECK(x.size(-1) == in, op, ": input ", describe(x), " has ", x.size(-1),
                " features in its last dim, but weight ", describe(weight), " expects ", in);
  MIXPREC_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == out), op, ": bias ",
                describe(bias), " must be [", out, "] to match weight ", describe(weight));

  const int64_t rows = x.numel() / in;  // in >= 1: check_floating refused an empty x
  Shape out_shape = x.shape();
  out_shape.back() = out;
  Tensor y = Tensor::empty(out_shape, x.dtype(), x.device());
  Tensor pre_gelu;
  if (!gelu && !bias.defined()) {
    run_gemm(false, true, rows, out, in, 0.0f, x, weight, y);
  } else {
    const GemmEpilogue epilogue = !gelu                ? GemmEpilogue::Bias
                                  : bias.defined() ? GemmEpilogue::BiasGelu
                                                   : GemmEpilogue::Gelu;
    if (gelu) pre_gelu = Tensor::empty(out_shape, x.dtype(), x.device());
    backend_for(y.device())
        .gemm_epilogue(gemm_desc(false, true, rows, out, in), epilogue, x, weight,
                       bias.defined() ? &bias : nullptr, y, gelu ? &pre_gelu : nullptr);
  }

  if (auto node = make_node<LinearBackward>({&x, &weight, &bias})) {
    node->x = save_for_backward(*node, x);
    node->weight = save_for_backward(*node, weight);
    if (gelu) node->pre_gelu = save_for_backward(*node, pre_gelu);
    node->gelu = gelu;
    node->rows = rows;
    attach_output(node, y);
  }
  // The pre-GELU sums too: gelu maps an FP16 overflow (-inf) to 0, which y would not show.
  if (gelu) check_forward(op, pre_gelu);
  check_forward(op, y);
  return y;
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return linear_forward("linear", x, weight, bias, false);
}

Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return linear_forward("linear_gelu", x, weight, bias, true);
}

}  // namespace mixprec::ops
