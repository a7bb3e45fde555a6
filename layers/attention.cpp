#include "layers/attention.h"

#include <cmath>
#include <utility>

#include "core/error.h"
#include "core/ops/ops.h"

namespace mixprec {

CausalSelfAttention::CausalSelfAttention(int64_t n_embd, int64_t n_head, bool bias, double dropout,
                                         std::shared_ptr<Generator> dropout_gen, Generator& init,
                                         Device device)
    : n_embd_(n_embd), n_head_(n_head), attn_dropout_(dropout), attn_dropout_gen_(dropout_gen) {
  MIXPREC_CHECK(n_embd >= 1 && n_head >= 1, "CausalSelfAttention: n_embd (", n_embd,
                ") and n_head (", n_head, ") must be >= 1");
  MIXPREC_CHECK(n_embd % n_head == 0, "CausalSelfAttention: n_embd (", n_embd,
                ") must be divisible by n_head (", n_head, ")");
  // nanoGPT's registration order: c_attn, c_proj, then the dropout.
  c_attn_ =
      register_module("c_attn", std::make_shared<Linear>(n_embd, 3 * n_embd, bias, init, device));
  c_proj_ = register_module("c_proj", std::make_shared<Linear>(n_embd, n_embd, bias, init, device));
  resid_dropout_ =
      register_module("resid_dropout", std::make_shared<Dropout>(dropout, std::move(dropout_gen)));
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  return (*resid_dropout_)(projected(x));
}

Tensor CausalSelfAttention::added_to(const Tensor& residual, const Tensor& x) {
  // A hook on this module watches its output, which must then exist as a tensor.
  if (has_forward_hook()) return residual + (*this)(x);
  return resid_dropout_->added_to(residual, projected(x));
}

void CausalSelfAttention::check_input(const Tensor& x) const {
  MIXPREC_CHECK(x.defined() && x.dim() == 3 && x.size(2) == n_embd_,
                "CausalSelfAttention: expects x [B, T, ", n_embd_, "], got ",
                x.defined() ? mixprec::describe(x) : std::string("an undefined tensor"));
}

Tensor CausalSelfAttention::projected(const Tensor& x) {
  check_input(x);
  const int64_t b = x.size(0), t = x.size(1), c = n_embd_, h = n_head_;
  // q, k and v [B, H, T, D]: the projection's three blocks, each with its heads apart.
  const std::vector<Tensor> qkv = ops::split_heads((*c_attn_)(x), h);
  Tensor y = attn_dropout_ > 0.0 && is_training()
                 ? ops::causal_attention(qkv[0], qkv[1], qkv[2], attn_dropout_, true,
                                         *attn_dropout_gen_)
                 : ops::causal_attention(qkv[0], qkv[1], qkv[2]);
  y = ops::reshape(ops::permute(y, {0, 2, 1, 3}), {b, t, c});  // heads side by side again
  return (*c_proj_)(y);
}

Tensor CausalSelfAttention::cached(const Tensor& x, LayerKv& cache) {
  check_input(x);
  const int64_t b = x.size(0), t = x.size(1), c = n_embd_, h = n_head_;
  const bool empty = !cache.keys.defined();
  MIXPREC_CHECK(empty || t == 1, "CausalSelfAttention: a cache of ", cache.keys.size(2),
                " positions takes one new position at a time, got ", t);
  const std::vector<Tensor> qkv = ops::split_heads((*c_attn_)(x), h);
  Tensor y;
  if (empty) {
    cache.keys = qkv[1];
    cache.values = qkv[2];
    y = ops::causal_attention(qkv[0], qkv[1], qkv[2]);
  } else {
    MIXPREC_CHECK(cache.keys.size(0) == b, "CausalSelfAttention: the cache holds ",
                  cache.keys.size(0), " sequences, x ", b);
    cache.keys = ops::concat({cache.keys, qkv[1]}, 2);
    cache.values = ops::concat({cache.values, qkv[2]}, 2);
    // The new position sees every cached one, so there is no mask. As in causal_attention,
    // the scores and softmax are FP32 whatever the working dtype (a product of two 16-bit
    // values is exact in FP32), and the probabilities are rounded once to the working dtype
    // as the operand of the product with V.
    const Tensor scores =
        ops::matmul(ops::cast(qkv[0], DType::F32), ops::cast(cache.keys, DType::F32), false, true);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c / h));
    const Tensor weights = ops::softmax(ops::mul_scalar(scores, scale));
    y = ops::matmul(ops::cast(weights, x.dtype()), cache.values);
  }
  y = ops::reshape(ops::permute(y, {0, 2, 1, 3}), {b, t, c});
  return (*c_proj_)(y);
}

std::string CausalSelfAttention::describe() const {
  return detail::concat("CausalSelfAttention(n_embd=", n_embd_, ", n_head=", n_head_,
                        ", dropout=", attn_dropout_, ")");
}

}  // namespace mixprec
