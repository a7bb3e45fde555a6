// The backward pass: iterative (no recursion, so deep graphs cannot overflow the stack),
// in topological order (a node runs once all gradients for its outputs have arrived).
#pragma once

#include "core/tensor.h"

namespace mixprec {

// Backpropagates `grad` (same shape as `root`) from `root` into the .grad of every leaf
// that requires grad; every node receives its gradients converted to its outputs' dtypes.
// Throws when root does not require grad, when `grad` does not match root's shape, when the
// graph was freed by an earlier backward without retain_graph, or when a tensor saved for
// backward was modified in place after it was saved.
void run_backward(const Tensor& root, const Tensor& grad, const BackwardOptions& options);

}  // namespace mixprec
