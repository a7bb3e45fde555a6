// What causal attention runs between its GEMMs, forward then backward, on any backend, for
// the benchmarks of both backends: fused, the two calls of Backend::attention_softmax and
// attention_softmax_backward; composed, the mask, softmax, dropout and casts they stand for
// (the same bits, core/backend.h).
#pragma once

#include <limits>

#include "core/backend.h"
#include "core/philox.h"
#include "core/tensor.h"

namespace mixprec::bench {

// The tensors of one pass, all of scores' shape on one device: scores and dprobs F32 inputs,
// probs F32, operand and ds in the working dtype, and two F32 temporaries for the composed
// form.
struct AttentionSoftmaxPass {
  Tensor scores, dprobs, probs, operand, ds, f32_a, f32_b;
  float dropout = 0.0f;
  PhiloxKey key{};

  AttentionSoftmaxPass(const Tensor& scores_in, const Tensor& dprobs_in, DType dtype,
                       float dropout_p, PhiloxKey dropout_key)
      : scores(scores_in),
        dprobs(dprobs_in),
        probs(Tensor::empty(scores_in.shape(), DType::F32, scores_in.device())),
        operand(Tensor::empty(scores_in.shape(), dtype, scores_in.device())),
        ds(Tensor::empty(scores_in.shape(), dtype, scores_in.device())),
        f32_a(Tensor::empty(scores_in.shape(), DType::F32, scores_in.device())),
        f32_b(Tensor::empty(scores_in.shape(), DType::F32, scores_in.device())),
        dropout(dropout_p),
        key(dropout_key) {}

  void run(Backend& backend, bool fused) {
    if (fused) {
      backend.attention_softmax(scores, dropout, key, probs, operand);
      backend.attention_softmax_backward(probs, dprobs, dropout, key, ds);
      return;
    }
    backend.causal_mask(scores, -std::numeric_limits<float>::infinity(), f32_a);
    backend.softmax(f32_a, probs, false);
    backend.dropout(probs, dropout, key, f32_a);
    backend.cast(f32_a, operand);
    backend.dropout(dprobs, dropout, key, f32_a);
    backend.softmax_backward(probs, f32_a, f32_b, false);
    backend.cast(f32_b, ds);
  }
};

}  // namespace mixprec::bench
