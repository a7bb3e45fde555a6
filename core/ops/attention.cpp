// causal_attention: softmax(q k^T / sqrt(D) + causal mask) v over q, k, v [B, H, T, D].
// The scores GEMM takes q and k in their dtype and writes its FP32 accumulator straight into
// an F32 [B, H, T, T] tensor (the 1/sqrt(D) scale applied inside it), so F16/BF16 scores are
// neither rounded nor able to overflow before the F32 mask and softmax; the probabilities are
// rounded once to q's dtype, only as the operand of the P v product. The backward keeps the
// F32 probabilities:
//   dV = P^T dO,  dP = dO V^T,  dS = softmax_backward(P, dP) / sqrt(D),  dQ = dS K,  dK = dS^T Q
// with dP written in F32 and dS rounded once to q's dtype as a GEMM operand (masked entries
// have P = 0, so dS is 0 there and no gradient reaches future positions).
// With attention dropout (nanoGPT's attn_dropout) the F32 probabilities are dropped out,
// P~ = dropout(P), before the rounding, and the backward uses dV = P~^T dO and
// dP = dropout(dO V^T) with the same Philox key.
//
// Everything between the GEMMs runs as one backend call each way (Backend::attention_softmax
// and attention_softmax_backward), bit for bit the mask, softmax, dropout and cast they stand
// for, so the [B, H, T, T] scores cross memory about three times less often. The softmax
// runs in place over the scores, and the rounded operand P~ is kept for dV rather than formed
// again. Until the backward that holds, beside the F32 probabilities, half their bytes again
// for 16-bit inputs, as many again for F32 with dropout, and nothing for F32 without (P~ is
// then P itself). In the backward dS overwrites dP when F32.
#include <cmath>

#include "core/autograd/record.h"
#include "core/generator.h"
#include "core/backend.h"
#include "core/ops/checks.h"
#include "core/ops/gemm_desc.h"
#include "core/ops/ops.h"
#include "core/ops/view.h"

namespace mixprec::ops {
namespace {

struct CausalAttentionBackward final : Node {
  Tensor q, k, v;
  Tensor probs;    // F32 [B, H, T, T], before dropout
  Tensor operand;  // P~ rounded to q's dtype: the forward's operand of P~ v
  float dropout_p = 0.0f;  // 0: no dropout
  PhiloxKey dropout_key{};
  std::string name() const override { return "causal_attention"; }

  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    Backend& be = backend_for(q.device());
    const DType dtype = q.dtype();
    const int64_t b = q.size(0), h = q.size(1), t = q.size(2), d = q.size(3);
    const int64_t batch = b * h, tt = t * t, td = t * d;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    const Tensor& dout = grads[0];
    const bool need_q = next_edges[0].valid(), need_k = next_edges[1].valid(),
               need_v = next_edges[2].valid();

    Tensor dv;
    if (need_v) {
      dv = Tensor::empty(v.shape(), dtype, v.device());
      be.gemm(batched_gemm_desc(true, false, t, d, t, batch, tt, td, 1.0f), operand, dout, dv);
    }
    Tensor dq, dk;
    if (need_q || need_k) {
      Tensor dp32 = Tensor::empty(probs.shape(), DType::F32, q.device());
      be.gemm(batched_gemm_desc(false, true, t, t, d, batch, td, td, 1.0f), dout, v, dp32);
      Tensor ds = dtype == DType::F32 ? dp32 : Tensor::empty(probs.shape(), dtype, q.device());
      be.attention_softmax_backward(probs, dp32, dropout_p, dropout_key, ds);
      if (need_q) {
        dq = Tensor::empty(q.shape(), dtype, q.device());
        be.gemm(batched_gemm_desc(false, false, t, d, t, batch, tt, td, scale), ds, k, dq);
      }
      if (need_k) {
        dk = Tensor::empty(k.shape(), dtype, k.device());
        be.gemm(batched_gemm_desc(true, false, t, d, t, batch, tt, td, scale), ds, q, dk);
      }
    }
    return {dq, dk, dv};
  }

  void release_saved() override {
    q = Tensor();
    k = Tensor();
    v = Tensor();
    probs = Tensor();
    operand = Tensor();
  }
};

}  // namespace

namespace {

Tensor causal_attention_impl(const Tensor& q, const Tensor& k, const Tensor& v, double dropout_p,
                             Generator* gen) {
  const char* op = "causal_attention";
  check_floating(op, q);
  check_floating(op, k);
  check_floating(op, v);
  check_rank(op, q, 4, "q [B, H, T, D]");
  check_same_dtype_device(op, {&q, &k, &v});
  MIXPREC_CHECK(k.shape() == q.shape() && v.shape() == q.shape(), op, ": q, k and v must have "
                "one shape [B, H, T, D], got q ", describe(q), ", k ", describe(k), ", v ",
                describe(v));
  MIXPREC_CHECK(dropout_p >= 0.0 && static_cast<float>(dropout_p) < 1.0f, op,
                ": dropout must be in [0, 1), got ", dropout_p);

  Backend& be = backend_for(q.device());
  const DType dtype = q.dtype();
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), d = q.size(3);
  const int64_t batch = b * h, tt = t * t, td = t * d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));

  // Every GEMM here is batched over (batch, head) with one [T, T] or [T, D] matrix per item,
  // so the batch strides are the matrix sizes.
  Tensor probs = Tensor::empty({b, h, t, t}, DType::F32, q.device());
  be.gemm(batched_gemm_desc(false, true, t, t, d, batch, td, td, scale), q, k, probs);
  PhiloxKey key{};
  const bool drop = dropout_p > 0.0 && gen != nullptr;
  if (drop) key = gen->next(static_cast<uint64_t>(probs.numel()));
  const float p_drop = drop ? static_cast<float>(dropout_p) : 0.0f;
  Tensor operand = dtype == DType::F32 && !drop ? probs : Tensor::empty(probs.shape(), dtype,
                                                                        q.device());
  be.attention_softmax(probs, p_drop, key, probs, operand);  // the scores become P in place
  Tensor out = Tensor::empty(q.shape(), dtype, q.device());
  be.gemm(batched_gemm_desc(false, false, t, d, t, batch, tt, td, 1.0f), operand, v, out);

  if (auto node = make_node<CausalAttentionBackward>({&q, &k, &v})) {
    node->q = save_for_backward(*node, q);
    node->k = save_for_backward(*node, k);
    node->v = save_for_backward(*node, v);
    node->probs = probs;
    node->operand = operand;
    if (drop) {
      node->dropout_p = static_cast<float>(dropout_p);
      node->dropout_key = key;
    }
    attach_output(node, out);
  }
  check_forward(op, out);
  return out;
}

}  // namespace

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v) {
  return causal_attention_impl(q, k, v, 0.0, nullptr);
}

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double dropout_p,
                        bool training, Generator& gen) {
  return causal_attention_impl(q, k, v, training ? dropout_p : 0.0, &gen);
}

}  // namespace mixprec::ops
