// A training or evaluation batch, and the interface every data set offers the trainer.
//
// Batches are a pure function of (seed, batch number): a data set never keeps a cursor, so
// the data position in a checkpoint is one integer (the number of the next batch) and a
// resumed run sees exactly the batches an uninterrupted run would have seen.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "apps/data/input_scan.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace mixprec {

struct Batch {
  Tensor inputs;   // images F32 [N, C, H, W] (scaled, normalised) or token ids I32 [N, T]
  Tensor targets;  // labels I32 [N] or next-token ids I32 [N, T]
  int64_t number = 0;  // the batch number it was made for
  int64_t epoch = 0;   // epoch it belongs to (0-based; text data: number / batches_per_epoch)
  // The scan of `inputs` for Inf/NaN (scan_inputs) made when the batch was built, if any (the
  // prefetcher makes it while the inputs are still on the host). A batch whose inputs change
  // afterwards must reset it.
  std::optional<InputScan> input_scan;
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // Training batch `number` (0, 1, 2, ...): batch_size examples. Thread-safe for concurrent
  // calls with different numbers (the prefetcher calls it from its own thread).
  virtual Batch train_batch(int64_t number) const = 0;
  // train_batch(number) with floating inputs in `input_dtype` (F32, F16 or BF16) and
  // input_scan set: the scan of train_batch(number)'s inputs (scan_inputs), then their bits
  // rounded to input_dtype as Tensor::to rounds them. Integer inputs (token ids) are left as
  // they are. This default does exactly that; a source that builds its inputs may write them
  // in input_dtype directly, and skip the scan when its values cannot be non-finite.
  virtual Batch train_batch_as(int64_t number, DType input_dtype) const;
  // How many training batches make one epoch (images: floor(train examples / batch_size),
  // the last partial batch dropped; text: train tokens / (batch_size * block_size), at least 1).
  virtual int64_t batches_per_epoch() const = 0;
  // Evaluation batches over the validation/test split, in a fixed order independent of the
  // seed: images, the whole test set in order (the last batch may be smaller); text, a fixed
  // set of windows. eval_batch_count() of them, numbered 0..count-1.
  virtual int64_t eval_batch_count() const = 0;
  virtual Batch eval_batch(int64_t number) const = 0;
  // "classification" (targets [N], accuracy is meaningful) or "language_model".
  virtual bool is_classification() const = 0;
  // Classes (images) or vocabulary size (text).
  virtual int64_t num_classes() const = 0;
  // Integer inputs (token ids) lie in [0, this); nullopt when the inputs are not indices
  // (images). Checked where the data is read, so a batch never holds an input outside it.
  virtual std::optional<int64_t> input_index_bound() const = 0;
  virtual std::string describe() const = 0;
};

}  // namespace mixprec
