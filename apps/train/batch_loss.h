// The loss of one batch, the same way for training and evaluation: inputs moved to the
// model's device (images cast to the working dtype, ids kept I32), logits from the model, mean
// cross-entropy in FP32 over every target (CNN: one per image; GPT: one per token).
#pragma once

#include <cstdint>

#include "apps/data/batch.h"
#include "core/device.h"
#include "core/dtype.h"
#include "layers/module.h"

namespace mixprec {

struct BatchLoss {
  Tensor loss;     // F32 scalar on `device`, attached to the graph when grad mode is on
  Tensor logits;   // [targets, classes] in the working dtype
  Tensor targets;  // I32 [targets] on `device`
};

BatchLoss batch_loss(Module& model, const Batch& batch, Device device, DType working_dtype);

struct EvalResult {
  double loss = 0.0;      // mean over every target of the split
  double accuracy = 0.0;  // fraction of targets whose arg-max logit is right
  int64_t targets = 0;    // images or tokens evaluated
};

// The model on every evaluation batch of `source`, in eval mode without recording a graph;
// the model's training mode is restored afterwards.
EvalResult evaluate(Module& model, const BatchSource& source, Device device, DType working_dtype);

}  // namespace mixprec
