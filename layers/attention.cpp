#include "layers/attention.h"

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

Tensor CausalSelfAttention::projected(const Tensor& x) {
  MIXPREC_CHECK(x.defined() && x.dim() == 3 && x.size(2) == n_embd_,
                "CausalSelfAttention: "
                "expects x [B, T, ",
                n_embd_, "], got ",
                x.defined() ? mixprec::describe(x) : std::string("an undefined tensor"));
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

std::string CausalSelfAttention::describe() const {
  return detail::concat("CausalSelfAttention(n_embd=", n_embd_, ", n_head=", n_head_,
                        ", dropout=", attn_dropout_, ")");
}

}  // namespace mixprec
