// Helpers every op uses to record itself in the graph (core/ops/unary.cpp):
//
//   Tensor y = ...compute...;
//   if (auto node = make_node<UnaryBackward>({&x})) {  // null when no input needs grad
//     node->op = op;                                    // what backward needs
//     node->x = save_for_backward(*node, x);
//     attach_output(node, y);                           // y.grad_fn = node
//   }
//   check_forward(name, y);                             // anomaly mode
//
// Saved tensors are stored detached so that a node never owns its own output's graph
// (that would be a reference cycle).
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/autograd/grad_mode.h"
#include "core/autograd/node.h"

namespace mixprec {

// The edge through which a gradient for `t` flows: its grad_fn, or its leaf accumulator.
// Invalid when `t` does not require grad.
Edge gradient_edge(const Tensor& t);

// True when grad mode is on and any defined input requires grad.
bool any_requires_grad(std::initializer_list<const Tensor*> inputs);
bool any_requires_grad(const std::vector<Tensor>& inputs);

namespace detail {
inline Edge input_edge(const Tensor* t) { return t ? gradient_edge(*t) : Edge{}; }
inline Edge input_edge(const Tensor& t) { return gradient_edge(t); }

template <class NodeT, class Inputs>
std::shared_ptr<NodeT> make_node(const Inputs& inputs) {
  if (!any_requires_grad(inputs)) return nullptr;
  auto node = std::make_shared<NodeT>();
  node->next_edges.reserve(inputs.size());
  for (const auto& t : inputs) node->next_edges.push_back(input_edge(t));
  node->layer = current_layer_name();
  return node;
}
}  // namespace detail

// A new node with one edge per input (invalid for a null input or one that needs no
// gradient), or null when no input needs grad.
template <class NodeT>
std::shared_ptr<NodeT> make_node(std::initializer_list<const Tensor*> inputs) {
  return detail::make_node<NodeT>(inputs);
}
template <class NodeT>
std::shared_ptr<NodeT> make_node(const std::vector<Tensor>& inputs) {
  return detail::make_node<NodeT>(inputs);
}

// A tensor the backward of `node` reads: returns t.detach() and records t's storage version
// in node.saved_versions, so that the backward throws, naming the op, when the tensor was
// written in place in between (fill_, copy_, set, mark_modified) instead of silently using
// the new values. Use it for inputs and for outputs the user gets; scratch tensors the op
// made and kept to itself (statistics, masks) cannot be written by anyone and need not be.
Tensor save_for_backward(Node& node, const Tensor& t);

// Makes `out` the `output_nr`-th output of `node` (and marks it as requiring grad).
void attach_output(const std::shared_ptr<Node>& node, Tensor& out, int output_nr = 0);

// In anomaly mode, throws when `out` holds Inf/NaN, naming the op and the current layer.
void check_forward(const char* op, const Tensor& out);

// "'op'", or "'op' in layer 'layer'" when `layer` is not empty: how errors name an op.
std::string op_label(const std::string& op, const std::string& layer);

}  // namespace mixprec
