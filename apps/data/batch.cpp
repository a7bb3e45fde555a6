#include "apps/data/batch.h"

namespace mixprec {

// The scan is of the inputs as the source made them, before they are rounded.
Batch BatchSource::train_batch_as(int64_t number, DType input_dtype) const {
  Batch batch = train_batch(number);
  batch.input_scan = scan_inputs(batch.inputs);
  if (is_floating(batch.inputs.dtype()) && batch.inputs.dtype() != input_dtype)
    batch.inputs = batch.inputs.to(input_dtype);
  return batch;
}

}  // namespace mixprec
