#include "layers/transformer_block.h"

#include <utility>

#include "core/error.h"
#include "core/ops/ops.h"

namespace mixprec {

Mlp::Mlp(int64_t n_embd, bool bias, double dropout, std::shared_ptr<Generator> dropout_gen,
         Generator& init, Device device, bool fuse_gelu)
    : n_embd_(n_embd) {
  c_fc_ = register_module("c_fc", std::make_shared<Linear>(n_embd, 4 * n_embd, bias, init, device));
  if (fuse_gelu) c_fc_->fuse_gelu();
  gelu_ = register_module("gelu", std::make_shared<GELU>(fuse_gelu));
  c_proj_ =
      register_module("c_proj", std::make_shared<Linear>(4 * n_embd, n_embd, bias, init, device));
  dropout_ = register_module("dropout", std::make_shared<Dropout>(dropout, std::move(dropout_gen)));
}

Tensor Mlp::forward(const Tensor& x) { return (*dropout_)(projected(x)); }

Tensor Mlp::added_to(const Tensor& residual, const Tensor& x) {
  // A hook on this module watches its output, which must then exist as a tensor.
  if (has_forward_hook()) return residual + (*this)(x);
  return dropout_->added_to(residual, projected(x));
}

Tensor Mlp::projected(const Tensor& x) { return (*c_proj_)((*gelu_)((*c_fc_)(x))); }

std::string Mlp::describe() const { return detail::concat("MLP(n_embd=", n_embd_, ")"); }

Block::Block(int64_t n_embd, int64_t n_head, bool bias, double dropout,
             std::shared_ptr<Generator> dropout_gen, Generator& init, Device device,
             bool fuse_gelu)
    : n_embd_(n_embd), n_head_(n_head) {
  ln_1_ = register_module("ln_1", std::make_shared<LayerNorm>(n_embd, bias, device));
  attn_ = register_module("attn", std::make_shared<CausalSelfAttention>(
                                      n_embd, n_head, bias, dropout, dropout_gen, init, device));
  ln_2_ = register_module("ln_2", std::make_shared<LayerNorm>(n_embd, bias, device));
  mlp_ = register_module("mlp",
                         std::make_shared<Mlp>(n_embd, bias, dropout, dropout_gen, init, device,
                                                 fuse_gelu));
}

Tensor Block::forward(const Tensor& x) {
  const Tensor h = attn_->added_to(x, (*ln_1_)(x));
  return mlp_->added_to(h, (*ln_2_)(h));
}

Tensor Block::forward_cached(const Tensor& x, LayerKv& cache) {
  const Tensor h = x + attn_->cached((*ln_1_)(x), cache);
  return h + (*mlp_)((*ln_2_)(h));
}

std::string Block::describe() const {
  return detail::concat("Block(n_embd=", n_embd_, ", n_head=", n_head_, ")");
}

}  // namespace mixprec
