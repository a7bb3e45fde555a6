// The backward pass: iterative (no recursion, so deep graphs cannot overflow the stack),
// in topological order (a node runs once all gradients for its outputs have arrived).
#pragma once

#include "core/tensor.h"

namespace mixprec {

// Backpropagates `grad` (same shape as `root`) from `root` into the .grad of every leaf
// that requires grad. Throws when root does not require grad, or when the graph was freed by
// an earlier backward without retain_graph.
void run_backward(const Tensor& root, const Tensor& grad, const BackwardOptions& options);

// The leaf-gradient mode of the backward pass running on this thread.
GradMode current_backward_grad_mode();

}  // namespace mixprec
