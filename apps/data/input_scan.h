// The host's check of a batch's inputs for Inf and NaN: where the first non-finite value is,
// and what it is. The training loop skips a step whose inputs hold one, without a forward
// pass (apps/train/nonfinite_guard.h); the prefetcher makes the scan on its worker thread
// while the batch is still on the host (apps/data/prefetcher.h), so the training thread
// only reads the result.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace mixprec {

struct InputScan {
  int64_t element = -1;  // flat index of the first non-finite input value; -1: none
  double value = 0.0;    // that value (Inf, -Inf or NaN) when element >= 0
};

// The first non-finite value of `inputs` in flat (row-major) order. Floating inputs of any
// dtype are checked (F16 and BF16 keep their Inf and NaN through the check); integer inputs
// (token ids) cannot hold either and give element -1 without being read. Inputs not on the
// CPU are copied to the host first (one host synchronisation on a GPU). `inputs` must be
// defined.
InputScan scan_inputs(const Tensor& inputs);

}  // namespace mixprec
