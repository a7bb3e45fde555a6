// linear: y = x @ W^T + b over the last dim of x, as GEMMs on the flattened rows of x
// (X is M x in, M = product of the leading dims).
//
// The bias enters the GEMM as its C operand (y = b broadcast over the rows, exact since y has
// b's dtype, then y += X W^T with beta = 1), so y is rounded once, as a GEMM with a bias
// epilogue does; its gradient is G summed over the rows with FP32 accumulation (sum_to).
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
  int64_t rows = 0;
  std::string name() const override { return "linear"; }

  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
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
  }
};

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_floating("linear", x);
  check_floating("linear", weight);
  if (bias.defined()) check_floating("linear", bias);
  check_same_dtype_device("linear", {&x, &weight, &bias});
  MIXPREC_CHECK(x.dim() >= 1, "linear: input must have at least 1 dimension, got ", describe(x));
  MIXPREC_CHECK(weight.dim() == 2, "linear: weight must be 2-D [out, in], got ", describe(weight));
  const int64_t out = weight.size(0), in = weight.size(1);
  MIXPREC_CHECK(x.size(-1) == in, "linear: input ", describe(x), " has ", x.size(-1),
                " features in its last dim, but weight ", describe(weight), " expects ", in);
  MIXPREC_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == out), "linear: bias ",
                describe(bias), " must be [", out, "] to match weight ", describe(weight));

  const int64_t rows = x.numel() / in;
  Shape out_shape = x.shape();
  out_shape.back() = out;
  Tensor y = Tensor::empty(out_shape, x.dtype(), x.device());
  float beta = 0.0f;
  if (bias.defined()) {
    backend_for(y.device()).expand(bias, y, 1.0f);
    beta = 1.0f;
  }
  run_gemm(false, true, rows, out, in, beta, x, weight, y);

  if (auto node = make_node<LinearBackward>({&x, &weight, &bias})) {
    node->x = save_for_backward(*node, x);
    node->weight = save_for_backward(*node, weight);
    node->rows = rows;
    attach_output(node, y);
  }
  check_forward("linear", y);
  return y;
}

}  // namespace mixprec::ops
