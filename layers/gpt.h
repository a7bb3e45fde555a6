// GPT: nanoGPT's model (model.py) with its parameter names, so that state_dict() loads into
// nanoGPT's GPT with load_state_dict(strict=True):
//
//   transformer.wte   Embedding(vocab_size, n_embd)      token embedding
//   transformer.wpe   Embedding(block_size, n_embd)      position embedding
//   transformer.drop  Dropout(dropout)
//   transformer.h.<i> Block (layers/transformer_block.h), i in [0, n_layer)
//   transformer.ln_f  LayerNorm(n_embd, bias)
//   lm_head           Linear(n_embd, vocab_size, bias=false); with tie_weights its weight is
//                     transformer.wte.weight itself (state_dict lists both names,
//                     parameters() the tensor once, as transformer.wte.weight)
//
// Initialisation as nanoGPT's _init_weights: every Linear and Embedding weight N(0, 0.02),
// every Linear bias 0, LayerNorm weight 1 and bias 0, and then every parameter whose name
// ends in "c_proj.weight" (attn.c_proj, mlp.c_proj) N(0, 0.02 / sqrt(2 n_layer)).
//
// Difference from nanoGPT: GELU is the tanh form (see layers/activations.h). Dropout is
// nanoGPT's: embeddings, the attention matrix, and both residual branches. forward returns the logits of every
// position; the loss is the caller's (ops::cross_entropy over [B*T, V]).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/device.h"
#include "core/generator.h"
#include "layers/dropout.h"
#include "layers/embedding.h"
#include "layers/kv_cache.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"
#include "layers/model_spec.h"
#include "layers/module.h"
#include "layers/sequential.h"

namespace mixprec {

class GPT : public Module {
 public:
  // Throws for vocab_size < 1, block_size, n_layer, n_head or n_embd < 1, n_embd not
  // divisible by n_head, or dropout outside [0, 1). dropout_gen may be null when dropout is
  // 0. Does not call assign_names() (build_gpt does, for the root).
  GPT(const GptSpec& spec, Generator& init, std::shared_ptr<Generator> dropout_gen,
      Device device = kCPU);

  // ids I32 [B, T] with 1 <= T <= block_size and values in [0, vocab_size), on the model's
  // device -> logits [B, T, vocab_size] in the working dtype. Throws naming the problem for
  // another dtype or rank, T > block_size, or an id outside the vocabulary.
  Tensor forward(const Tensor& ids) override;
  // Incremental decoding: ids I32 [B, Tn] are the positions cache.length .. cache.length +
  // Tn - 1 of sequences whose earlier positions `cache` holds (any Tn >= 1 when the cache is
  // empty, 1 otherwise; cache.length + Tn <= block_size). Returns the logits [B, vocab_size]
  // of the last new position and extends the cache by Tn positions. Inference only: call it
  // in eval mode under NoGradGuard. Within FP32 rounding, the logits equal those forward()
  // gives at that position for the whole sequence. Throws naming the problem for ids as
  // forward() does, a cache that would pass block_size, or one built for another batch.
  Tensor forward_cached(const Tensor& ids, KvCache& cache);
  std::string describe() const override;

  const GptSpec& spec() const { return spec_; }
  const std::shared_ptr<Embedding>& wte() const { return wte_; }
  const std::shared_ptr<Embedding>& wpe() const { return wpe_; }
  const std::shared_ptr<Sequential>& blocks() const { return h_; }  // transformer.h
  const std::shared_ptr<LayerNorm>& ln_f() const { return ln_f_; }
  const std::shared_ptr<Linear>& lm_head() const { return lm_head_; }

 private:
  GptSpec spec_;
  std::shared_ptr<Embedding> wte_, wpe_;
  std::shared_ptr<Dropout> drop_;
  std::shared_ptr<Sequential> h_;
  std::shared_ptr<LayerNorm> ln_f_;
  std::shared_ptr<Linear> lm_head_;
  Tensor positions_;  // I32 [T] = 0..T-1 for the last T seen, on the ids' device

  // Throws for ids that are not I32 [B, T] on the model's device, or when start + T passes
  // block_size.
  void check_ids(const Tensor& ids, int64_t start) const;
  Tensor token_embedding(const Tensor& ids);
};

}  // namespace mixprec
