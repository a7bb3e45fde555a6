// CausalSelfAttention: nanoGPT's multi-head causal self-attention with its parameter names.
//
//   qkv = c_attn(x)                  [B, T, 3C]
//   q, k, v = the three C blocks, [B, T, H, D] -> [B, H, T, D]   (D = C / H; ops::split_heads)
//   y = attn_dropout(softmax(q k^T / sqrt(D) + causal mask)) v     (ops::causal_attention)
//   y -> [B, T, H, D] -> [B, T, C] -> c_proj -> resid_dropout
//
// Both dropouts use the module's `dropout` probability in training mode, as nanoGPT's
// attn_dropout and resid_dropout do; the attention mask is drawn inside the fused op.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/device.h"
#include "core/generator.h"
#include "layers/dropout.h"
#include "layers/kv_cache.h"
#include "layers/linear.h"
#include "layers/module.h"

namespace mixprec {

class CausalSelfAttention : public Module {
 public:
  // Children `c_attn` Linear(C, 3C, bias), `c_proj` Linear(C, C, bias) with torch's default
  // initialisation (GPT re-initialises them), and `resid_dropout` Dropout(dropout,
  // dropout_gen); the attention dropout draws from dropout_gen too (which may be null only
  // when dropout is 0). Throws for n_embd or n_head < 1 and n_embd not divisible by n_head.
  CausalSelfAttention(int64_t n_embd, int64_t n_head, bool bias, double dropout,
                      std::shared_ptr<Generator> dropout_gen, Generator& init,
                      Device device = kCPU);

  // x [B, T, n_embd] in the working dtype -> [B, T, n_embd]; position t attends to
  // positions 0..t only.
  Tensor forward(const Tensor& x) override;
  // residual + forward(x), the residual added by resid_dropout's pass (Dropout::added_to),
  // or after this module's hook when it has one; Block's residual branch. Values and the
  // gradients' bits are forward's plus the add's.
  Tensor added_to(const Tensor& residual, const Tensor& x);
  // Inference with a cache (no dropout, no graph needed): x [B, Tn, n_embd] holds the
  // positions after the cache.keys' length L. Their k and v are appended to `cache`, and each
  // new position attends to every cached position and to the new ones up to itself. Returns
  // c_proj's output [B, Tn, n_embd]. Tn is any length when the cache is empty and must be 1
  // otherwise (a prompt is read in one call, then one token at a time). The scores and the
  // softmax are FP32, as in ops::causal_attention, so the result agrees with forward() on the
  // whole sequence within FP32 rounding.
  Tensor cached(const Tensor& x, LayerKv& cache);
  std::string describe() const override;

  const std::shared_ptr<Linear>& c_attn() const { return c_attn_; }
  const std::shared_ptr<Linear>& c_proj() const { return c_proj_; }

 private:
  int64_t n_embd_, n_head_;
  double attn_dropout_;
  std::shared_ptr<Generator> attn_dropout_gen_;
  std::shared_ptr<Linear> c_attn_, c_proj_;
  std::shared_ptr<Dropout> resid_dropout_;

  // Everything before resid_dropout: c_proj's output.
  Tensor projected(const Tensor& x);
  void check_input(const Tensor& x) const;
};

}  // namespace mixprec
