// matmul: (batched) matrix product on the backend GEMM, with transposes as GEMM flags.
//
// With op(X) = X^T when X's trans flag is set, y = op(a) @ op(b) has the gradients
//   d op(a) = g @ op(b)^T      d op(b) = op(a)^T @ g
// and a transposed operand receives the transpose of its d op(.). Each is one GEMM with the
// right flags, so no transposed copy is ever made. When a 2-D b is shared by the whole batch,
// its gradient sums over the batch inside one GEMM (the batch folded into the contraction),
// which keeps FP32 accumulation and one rounding.
#include "core/autograd/record.h"
#include "core/backend.h"
#include "core/ops/checks.h"
#include "core/ops/gemm_desc.h"
#include "core/ops/ops.h"

namespace mixprec::ops {
namespace {

// One operand of a GEMM: `batch` row-major matrices (one shared one when `shared`), read
// transposed when `trans`.
struct Operand {
  const Tensor* t;
  bool trans;
  bool shared;
};

// out[i] = op(x[i]) @ op(y[i]) for i in [0, batch); op(x) is m x k, op(y) is k x n.
Tensor product(const Operand& x, const Operand& y, int64_t batch, int64_t m, int64_t n, int64_t k,
               const Shape& out_shape) {
  const GemmDesc desc = batched_gemm_desc(x.trans, y.trans, m, n, k, batch,
                                          x.shared ? 0 : m * k, y.shared ? 0 : k * n);
  Tensor out = Tensor::empty(out_shape, x.t->dtype(), x.t->device());
  if (out.numel() > 0) backend_for(out.device()).gemm(desc, *x.t, *y.t, out);
  return out;
}

struct MatmulDims {
  int64_t batch = 1;
  int64_t m = 0, n = 0, k = 0;
  bool b_shared = false;  // 2-D b broadcast over a's batch
};

struct MatmulBackward final : Node {
  Tensor a, b;
  bool trans_a = false, trans_b = false;
  MatmulDims dims;
  std::string name() const override { return "matmul"; }

  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    const auto [batch, m, n, k, b_shared] = dims;
    Tensor ga, gb;
    if (next_edges[0].valid()) {
      // d op(a) = g @ op(b)^T (m x k); a stored k x m takes its transpose, op(b) @ g^T.
      ga = trans_a
               ? product({&b, trans_b, b_shared}, {&g, true, false}, batch, k, m, n, a.shape())
               : product({&g, false, false}, {&b, !trans_b, b_shared}, batch, m, k, n, a.shape());
    }
    if (next_edges[1].valid()) gb = grad_b(g);
    return {ga, gb};
  }

  // d op(b) = op(a)^T @ g (k x n); b stored n x k takes its transpose, g^T @ op(a).
  Tensor grad_b(const Tensor& g) const {
    const auto [batch, m, n, k, b_shared] = dims;
    if (!b_shared) {
      return trans_b
                 ? product({&g, true, false}, {&a, trans_a, false}, batch, n, k, m, b.shape())
                 : product({&a, !trans_a, false}, {&g, false, false}, batch, k, n, m, b.shape());
    }
    // Sum over the batch: fold it into the rows of one (batch*m) x k matrix A' so that
    // sum_i op(a_i)^T g_i = A'^T G with G = g as (batch*m) x n. A stored a_i (k x m) is
    // permuted to k x (batch*m) first, which is then A'^T stored.
    const int64_t rows = batch * m;
    const Tensor g2 = reshape(g, {rows, n});
    Tensor a2;
    if (!trans_a) {
      a2 = reshape(a, {rows, k});
    } else {
      Tensor a3 = reshape(a, {batch, k, m});
      a2 = Tensor::empty({k, batch, m}, a.dtype(), a.device());
      backend_for(a.device()).permute(a3, {1, 0, 2}, a2);
      a2 = reshape(a2, {k, rows});
    }
    return trans_b ? product({&g2, true, false}, {&a2, trans_a, false}, 1, n, k, rows, b.shape())
                   : product({&a2, !trans_a, false}, {&g2, false, false}, 1, k, n, rows, b.shape());
  }

  void release_saved() override {
    a = Tensor();
    b = Tensor();
  }
};

std::string flags(bool trans_a, bool trans_b) {
  return std::string(" (trans_a=") + (trans_a ? "true" : "false") +
         ", trans_b=" + (trans_b ? "true" : "false") + ")";
}

MatmulDims matmul_dims(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  check_floating("matmul", a);
  check_floating("matmul", b);
  check_same_dtype_device("matmul", {&a, &b});
  MIXPREC_CHECK(a.dim() >= 2 && b.dim() >= 2,
                "matmul: both operands need at least 2 dimensions, got ", describe(a), " and ",
                describe(b));
  MatmulDims d;
  d.m = trans_a ? a.size(-1) : a.size(-2);
  d.k = trans_a ? a.size(-2) : a.size(-1);
  const int64_t kb = trans_b ? b.size(-1) : b.size(-2);
  d.n = trans_b ? b.size(-2) : b.size(-1);
  MIXPREC_CHECK(d.k == kb, "matmul: inner dimensions differ: ", describe(a), " x ", describe(b),
                flags(trans_a, trans_b), " contracts ", d.k, " with ", kb);
  const Shape batch_a(a.shape().begin(), a.shape().end() - 2);
  const Shape batch_b(b.shape().begin(), b.shape().end() - 2);
  d.batch = shape_numel(batch_a);
  d.b_shared = b.dim() == 2 && a.dim() > 2;
  MIXPREC_CHECK(d.b_shared || batch_a == batch_b, "matmul: batch dimensions ", shape_str(batch_a),
                " of ", describe(a), " and ", shape_str(batch_b), " of ", describe(b),
                " differ (b must have the same batch dimensions as a, or be 2-D)");
  return d;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  const MatmulDims d = matmul_dims(a, b, trans_a, trans_b);
  Shape out_shape(a.shape().begin(), a.shape().end() - 2);
  out_shape.push_back(d.m);
  out_shape.push_back(d.n);
  Tensor y =
      product({&a, trans_a, false}, {&b, trans_b, d.b_shared}, d.batch, d.m, d.n, d.k, out_shape);
  if (auto node = make_node<MatmulBackward>({&a, &b})) {
    node->a = save_for_backward(*node, a);
    node->b = save_for_backward(*node, b);
    node->trans_a = trans_a;
    node->trans_b = trans_b;
    node->dims = d;
    attach_output(node, y);
  }
  check_forward("matmul", y);
  return y;
}

}  // namespace mixprec::ops
