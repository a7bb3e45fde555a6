// nanoGPT's transformer block (pre-norm) and its MLP, with their parameter names.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/device.h"
#include "core/generator.h"
#include "layers/activations.h"
#include "layers/attention.h"
#include "layers/dropout.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"
#include "layers/module.h"

namespace mixprec {

// x -> c_fc Linear(C, 4C, bias) -> gelu -> c_proj Linear(4C, C, bias) -> dropout.
// The GELU is the tanh form (see GELU in layers/activations.h); nanoGPT's nn.GELU() is the
// erf form. fuse_gelu: c_fc applies the gelu in its GEMM (Linear::fuse_gelu) and the gelu
// module passes its input through.
class Mlp : public Module {
 public:
  Mlp(int64_t n_embd, bool bias, double dropout, std::shared_ptr<Generator> dropout_gen,
      Generator& init, Device device = kCPU, bool fuse_gelu = true);
  // x [..., n_embd] -> [..., n_embd].
  Tensor forward(const Tensor& x) override;
  // residual + forward(x), the add in the dropout's pass, as CausalSelfAttention::added_to.
  Tensor added_to(const Tensor& residual, const Tensor& x);
  std::string describe() const override;

  const std::shared_ptr<Linear>& c_fc() const { return c_fc_; }
  const std::shared_ptr<Linear>& c_proj() const { return c_proj_; }

 private:
  int64_t n_embd_;
  std::shared_ptr<Linear> c_fc_, c_proj_;
  std::shared_ptr<GELU> gelu_;
  std::shared_ptr<Dropout> dropout_;

  // Everything before the dropout: c_proj's output.
  Tensor projected(const Tensor& x);
};

// Children ln_1, attn, ln_2, mlp:
//   x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))
// Each residual add runs in the pass of the dropout that ends its branch (added_to), unless a
// forward hook watches the branch's output, which then exists as a tensor of its own.
class Block : public Module {
 public:
  // fuse_gelu: the MLP's, see Mlp.
  Block(int64_t n_embd, int64_t n_head, bool bias, double dropout,
        std::shared_ptr<Generator> dropout_gen, Generator& init, Device device = kCPU,
        bool fuse_gelu = true);
  // x [B, T, n_embd] -> [B, T, n_embd].
  Tensor forward(const Tensor& x) override;
  // The same for inference with the attention's cache (CausalSelfAttention::cached): x holds
  // the positions after those cached. Dropout does not apply (the model is in eval mode).
  Tensor forward_cached(const Tensor& x, LayerKv& cache);
  std::string describe() const override;

  const std::shared_ptr<LayerNorm>& ln_1() const { return ln_1_; }
  const std::shared_ptr<CausalSelfAttention>& attn() const { return attn_; }
  const std::shared_ptr<LayerNorm>& ln_2() const { return ln_2_; }
  const std::shared_ptr<Mlp>& mlp() const { return mlp_; }

 private:
  int64_t n_embd_, n_head_;
  std::shared_ptr<LayerNorm> ln_1_, ln_2_;
  std::shared_ptr<CausalSelfAttention> attn_;
  std::shared_ptr<Mlp> mlp_;
};

}  // namespace mixprec
