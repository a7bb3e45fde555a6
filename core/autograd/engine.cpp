#include "core/autograd/engine.h"

#include <unordered_map>
#include <vector>

#include "core/autograd/grad_mode.h"
#include "core/autograd/node.h"
#include "core/autograd/record.h"
#include "core/backend.h"
#include "core/error.h"

namespace mixprec {
namespace {

thread_local GradMode tls_backward_grad_mode = GradMode::Accumulate;

class GradModeScope {
 public:
  explicit GradModeScope(GradMode mode) : previous_(tls_backward_grad_mode) {
    tls_backward_grad_mode = mode;
  }
  ~GradModeScope() { tls_backward_grad_mode = previous_; }

 private:
  GradMode previous_;
};

std::string node_label(const Node& node) {
  std::string label = "'";
  label.append(node.name()).append("'");
  if (!node.layer.empty()) label.append(" in layer '").append(node.layer).append("'");
  return label;
}

// Sums a gradient into a buffer slot, converting to the slot's dtype where they differ.
void add_into(Tensor& slot, const Tensor& grad) {
  if (!slot.defined()) {
    slot = grad;
    return;
  }
  Tensor g = grad;
  if (g.dtype() != slot.dtype()) g = grad.detach().to(slot.dtype());
  // Buffers may alias a tensor another node also received; never write into a shared one.
  Tensor sum = Tensor::empty(slot.shape(), slot.dtype(), slot.device());
  backend_for(slot.device()).binary(BinaryOp::Add, slot, g, sum);
  slot = sum;
}

// A saved tensor written in place since the forward would give wrong gradients silently.
void check_saved_versions(const Node& node) {
  for (const SavedVersion& saved : node.saved_versions) {
    const uint64_t now = saved.storage->version();
    if (now != saved.version)
      MIXPREC_FAIL("backward: a tensor saved by ", node_label(node),
                   " was modified in place after it was saved (version ", saved.version,
                   ", now ", now, "); clone() it before modifying it, or modify it after "
                   "backward");
  }
}

// Counts, for every node reachable from `root`, how many edges point at it. Fails before any
// gradient is computed when a node's saved tensors were freed, or modified before this
// backward, so such a failure leaves no partial sums in any .grad.
std::unordered_map<Node*, int> count_dependencies(Node* root) {
  std::unordered_map<Node*, int> deps;
  std::vector<Node*> stack{root};
  deps[root] = 0;
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    if (node->released)
      MIXPREC_FAIL("backward: trying to run backward through ", node_label(*node),
                   " a second time, but its saved tensors were freed by the first backward. "
                   "Pass retain_graph=true to the first backward() if you need to run it twice.");
    check_saved_versions(*node);
    for (const Edge& edge : node->next_edges) {
      if (!edge.valid()) continue;
      auto [it, inserted] = deps.try_emplace(edge.node.get(), 0);
      ++it->second;
      if (inserted) stack.push_back(edge.node.get());
    }
  }
  return deps;
}

void check_gradients(const Node& node, const std::vector<Tensor>& grads) {
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    if (!g.defined() || !is_floating(g.dtype())) continue;
    if (!backend_for(g.device()).all_finite(g))
      MIXPREC_FAIL("anomaly: the gradient computed by ", node_label(node), " for input ", i,
                   " contains Inf or NaN (", describe(g), ")");
  }
}

}  // namespace

GradMode current_backward_grad_mode() { return tls_backward_grad_mode; }

void run_backward(const Tensor& root, const Tensor& grad, const BackwardOptions& options) {
  MIXPREC_CHECK(root.defined(), "backward: called on an undefined tensor");
  MIXPREC_CHECK(root.requires_grad(), "backward: the tensor ", describe(root),
                " does not require grad and has no grad_fn (did you forget "
                "set_requires_grad(true), or run the forward under NoGradGuard?)");
  MIXPREC_CHECK(grad.defined() && grad.shape() == root.shape(), "backward: gradient ",
                grad.defined() ? describe(grad) : std::string("(undefined)"),
                " does not match the tensor ", describe(root));
  GradModeScope mode_scope(options.grad_mode);
  NoGradGuard no_grad;  // gradient arithmetic itself is never recorded

  const Edge root_edge = gradient_edge(root);
  std::unordered_map<Node*, int> deps = count_dependencies(root_edge.node.get());
  std::unordered_map<Node*, std::vector<Tensor>> buffers;

  Tensor root_grad = grad.dtype() == root.dtype() ? grad : grad.to(root.dtype());
  buffers[root_edge.node.get()].resize(root_edge.node->outputs.size());
  buffers[root_edge.node.get()][root_edge.input_nr] = root_grad;
  std::vector<std::shared_ptr<Node>> ready{root_edge.node};

  const bool anomaly = anomaly_mode_enabled();
  while (!ready.empty()) {
    std::shared_ptr<Node> node = std::move(ready.back());
    ready.pop_back();
    std::vector<Tensor> grad_outputs = std::move(buffers[node.get()]);
    buffers.erase(node.get());
    grad_outputs.resize(node->outputs.size());
    for (size_t i = 0; i < grad_outputs.size(); ++i)
      if (!grad_outputs[i].defined()) {
        const OutputMeta& m = node->outputs[i];
        grad_outputs[i] = Tensor::zeros(m.shape, m.dtype, m.device);
      }

    check_saved_versions(*node);  // again: this backward's own .grad updates count too
    std::vector<Tensor> grad_inputs = node->apply(grad_outputs);
    if (anomaly) check_gradients(*node, grad_inputs);
    if (!options.retain_graph && !dynamic_cast<AccumulateGrad*>(node.get())) {
      node->release_saved();
      node->saved_versions.clear();
      node->released = true;
    }
    MIXPREC_CHECK(grad_inputs.size() <= node->next_edges.size(), "backward: '", node->name(),
                  "' returned ", grad_inputs.size(), " gradients for ", node->next_edges.size(),
                  " inputs");
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& edge = node->next_edges[i];
      if (!edge.valid()) continue;
      Node* next = edge.node.get();
      if (i < grad_inputs.size() && grad_inputs[i].defined()) {
        std::vector<Tensor>& slots = buffers[next];
        slots.resize(next->outputs.size());
        add_into(slots[edge.input_nr], grad_inputs[i]);
      }
      if (--deps[next] == 0) ready.push_back(edge.node);
    }
  }
}

std::vector<Tensor> AccumulateGrad::apply(const std::vector<Tensor>& grad_outputs) {
  std::shared_ptr<TensorImpl> leaf_impl = leaf_.lock();
  if (!leaf_impl) return {};
  Tensor leaf(leaf_impl);
  AutogradMeta& meta = leaf.autograd_meta();
  const DType target = meta.grad_dtype.value_or(leaf.dtype());
  const Tensor& incoming = grad_outputs.at(0);
  MIXPREC_CHECK(incoming.shape() == leaf.shape(), "backward: gradient ", describe(incoming),
                " does not match the leaf ", describe(leaf));
  if (!meta.grad.defined() || current_backward_grad_mode() == GradMode::Overwrite) {
    // A private copy: the incoming tensor may be shared with other parts of the graph.
    meta.grad = incoming.dtype() == target ? incoming.clone() : incoming.detach().to(target);
  } else {
    Tensor g = incoming.dtype() == target ? incoming : incoming.detach().to(target);
    backend_for(leaf.device()).binary(BinaryOp::Add, meta.grad, g, meta.grad);
    meta.grad.mark_modified();
  }
  return {};
}

}  // namespace mixprec
