#include "apps/train/batch_loss.h"

#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/ops/ops.h"

namespace mixprec {

BatchLoss batch_loss(Module& model, const Batch& batch, Device device, DType working_dtype) {
  Tensor inputs = batch.inputs.to(device);
  if (is_floating(inputs.dtype()) && inputs.dtype() != working_dtype) {
    inputs = inputs.to(working_dtype);
  }
  Tensor logits = model(inputs);
  const int64_t classes = logits.size(-1);
  logits = ops::reshape(logits, {-1, classes});
  Tensor targets = batch.targets.to(device).reshape({-1});
  MIXPREC_CHECK(targets.numel() == logits.size(0), "the model gives ", logits.size(0),
                " predictions for a batch with ", targets.numel(), " targets");
  Tensor loss = ops::cross_entropy(logits, targets);
  return {loss, logits, targets};
}

namespace {

// Right predictions among `logits` rows (on the host: evaluation is not the hot path).
int64_t count_correct(const Tensor& logits, const Tensor& targets) {
  const std::vector<float> values = logits.to(DType::F32).to(kCPU).to_float_vector();
  const std::vector<int32_t> labels = targets.to(kCPU).to_int_vector();
  const int64_t rows = logits.size(0), classes = logits.size(1);
  int64_t correct = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = values.data() + r * classes;
    int64_t best = 0;
    for (int64_t c = 1; c < classes; ++c) {
      if (row[c] > row[best]) best = c;
    }
    if (best == labels[r]) ++correct;
  }
  return correct;
}

}  // namespace

EvalResult evaluate(Module& model, const BatchSource& source, Device device, DType working_dtype) {
  const bool was_training = model.is_training();
  model.eval();
  NoGradGuard no_grad;
  EvalResult result;
  double loss_sum = 0.0;
  int64_t correct = 0;
  try {
    for (int64_t n = 0; n < source.eval_batch_count(); ++n) {
      const BatchLoss out = batch_loss(model, source.eval_batch(n), device, working_dtype);
      const int64_t count = out.targets.numel();
      loss_sum += out.loss.item() * static_cast<double>(count);
      correct += count_correct(out.logits, out.targets);
      result.targets += count;
    }
  } catch (...) {
    model.train(was_training);
    throw;
  }
  model.train(was_training);
  if (result.targets > 0) {
    result.loss = loss_sum / static_cast<double>(result.targets);
    result.accuracy = static_cast<double>(correct) / static_cast<double>(result.targets);
  }
  return result;
}

}  // namespace mixprec
