#include "core/autograd/engine.h"

#include <unordered_map>
#include <utility>
#include <vector>

#include "core/autograd/grad_mode.h"
#include "core/autograd/node.h"
#include "core/autograd/record.h"
#include "core/backend.h"
#include "core/error.h"

namespace mixprec {
namespace {

std::string node_label(const Node& node) { return op_label(node.name(), node.layer); }

// The pass whose widenings are pending on this thread, if any (see flush_pending_widenings).
thread_local PendingWidenings* current_widenings = nullptr;

bool overlaps(const Tensor& a, const Tensor& b) {
  const auto* a0 = static_cast<const unsigned char*>(a.data());
  const auto* b0 = static_cast<const unsigned char*>(b.data());
  return a.nbytes() > 0 && b.nbytes() > 0 && a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

// One backward pass's pending widenings, made this thread's current ones for the pass.
// finish() widens them at the pass's end; a pass left by an exception widens them on the way
// out, keeping the first error.
class WideningScope {
 public:
  WideningScope() : outer_(std::exchange(current_widenings, &pending)) {}
  WideningScope(const WideningScope&) = delete;
  WideningScope& operator=(const WideningScope&) = delete;
  ~WideningScope() {
    current_widenings = outer_;
    if (finished_) return;
    try {
      pending.flush();
    } catch (...) {
    }
  }
  void finish() {
    current_widenings = outer_;
    finished_ = true;
    pending.flush();
  }

  PendingWidenings pending;

 private:
  PendingWidenings* outer_;
  bool finished_ = false;
};

// Sums a gradient into the slot of an output whose recorded dtype is `dtype`, converting
// the gradient to it first, so that every node receives gradients in its outputs' dtypes.
void add_into(Tensor& slot, const Tensor& grad, DType dtype) {
  const Tensor g = grad.to(dtype);  // unrecorded: the engine runs under NoGradGuard
  if (!slot.defined()) {
    slot = g;
    return;
  }
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
// A .grad already holding gradients of another loss scale cannot take this backward's sum:
// no single division would restore both parts (see Tensor::grad_scale()).
void check_grad_scale(Node& node, double loss_scale, GradMode mode) {
  AccumulateGrad* sink = node.as_accumulator();
  if (sink == nullptr || mode == GradMode::Overwrite) return;
  const Tensor leaf = sink->leaf();
  if (!leaf.defined() || !leaf.grad().defined() || leaf.grad_scale() == loss_scale) return;
  if (leaf.grad_zeroed()) return;
  const std::string name =
      leaf.name().empty() ? describe(leaf) : detail::concat("'", leaf.name(), "'");
  MIXPREC_FAIL("backward: the .grad of ", name, " holds gradients scaled by ", leaf.grad_scale(),
               " and this backward's loss is scaled by ", loss_scale,
               "; one division could not restore their sum. Keep one loss scale for the whole "
               "accumulation window (call scaler.update() only after the last microbatch), or "
               "zero the gradients first");
}

std::unordered_map<Node*, int> count_dependencies(Node* root, double loss_scale, GradMode mode) {
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
    check_grad_scale(*node, loss_scale, mode);
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

void run_backward(const Tensor& root, const Tensor& grad, const BackwardOptions& options) {
  MIXPREC_CHECK(root.defined(), "backward: called on an undefined tensor");
  MIXPREC_CHECK(root.requires_grad(), "backward: the tensor ", describe(root),
                " does not require grad and has no grad_fn (did you forget "
                "set_requires_grad(true), or run the forward under NoGradGuard?)");
  MIXPREC_CHECK(grad.defined() && grad.shape() == root.shape(), "backward: gradient ",
                grad.defined() ? describe(grad) : std::string("(undefined)"),
                " does not match the tensor ", describe(root));
  NoGradGuard no_grad;  // gradient arithmetic itself is never recorded

  const Edge root_edge = gradient_edge(root);
  const double loss_scale = root.loss_scale();
  std::unordered_map<Node*, int> deps =
      count_dependencies(root_edge.node.get(), loss_scale, options.grad_mode);
  std::unordered_map<Node*, std::vector<Tensor>> buffers;

  std::vector<Tensor>& root_slots = buffers[root_edge.node.get()];
  root_slots.resize(root_edge.node->outputs.size());
  root_slots[root_edge.input_nr] = grad.to(root_edge.node->outputs[root_edge.input_nr].dtype);
  std::vector<std::shared_ptr<Node>> ready{root_edge.node};

  const bool anomaly = anomaly_mode_enabled();
  // Leaves' 16-bit gradients are widened into their F32 .grad buffers once the pass ends, or
  // earlier where a grad_tap callback may look (flush_pending_widenings). The items are
  // valid by construction (16-bit sources, F32 destinations of their shapes, no destination
  // named twice), so only a failing device can make the widening fail. A pass that fails
  // part-way still widens what it gathered, so the leaves it reached keep their gradients as
  // when each was widened on arrival (unless the device fails too: those buffers are then
  // undefined, and the first error is the one reported).
  WideningScope widenings;
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
    std::vector<Tensor> grad_inputs;
    if (AccumulateGrad* leaf = node->as_accumulator())
      leaf->accumulate(grad_outputs[0], options.grad_mode, loss_scale, &widenings.pending);
    else
      grad_inputs = node->apply(grad_outputs);
    if (anomaly) check_gradients(*node, grad_inputs);
    if (!options.retain_graph) node->release();
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
        add_into(slots[edge.input_nr], grad_inputs[i], next->outputs[edge.input_nr].dtype);
      }
      if (--deps[next] == 0) ready.push_back(edge.node);
    }
  }
  widenings.finish();
}

void PendingWidenings::add(const Tensor& source, const Tensor& destination, bool accumulate) {
  // Leaves whose .grad share memory (set_grad with one buffer): the earlier sums land first,
  // in arrival order, as when each leaf was widened on arrival; one call may not name the
  // same memory twice.
  for (const Item& item : items_) {
    if (overlaps(item.destination, destination)) {
      flush();
      break;
    }
  }
  items_.push_back({source, destination, accumulate});
}

void flush_pending_widenings() {
  if (current_widenings != nullptr) current_widenings->flush();
}

void PendingWidenings::flush() {
  std::vector<Item> items = std::move(items_);
  items_.clear();
  // One call per device, each with its items in the order they arrived.
  std::vector<bool> done(items.size(), false);
  for (size_t first = 0; first < items.size(); ++first) {
    if (done[first]) continue;
    const Device device = items[first].destination.device();
    std::vector<GradientWidening> batch;
    for (size_t k = first; k < items.size(); ++k) {
      if (done[k] || items[k].destination.device() != device) continue;
      batch.push_back({&items[k].source, &items[k].destination, items[k].accumulate});
      done[k] = true;
    }
    backend_for(device).widen_gradients(batch);
  }
}

std::vector<Tensor> AccumulateGrad::apply(const std::vector<Tensor>& grad_outputs) {
  accumulate(grad_outputs.at(0), GradMode::Accumulate);
  return {};
}

Tensor AccumulateGrad::leaf() const {
  std::shared_ptr<TensorImpl> impl = leaf_.lock();
  return impl ? Tensor(impl) : Tensor();
}

void AccumulateGrad::accumulate(const Tensor& grad, GradMode mode, double loss_scale,
                                PendingWidenings* widenings) {
  std::shared_ptr<TensorImpl> leaf_impl = leaf_.lock();
  if (!leaf_impl) return;
  NoGradGuard no_grad;
  Tensor leaf(leaf_impl);
  AutogradMeta& meta = leaf.autograd_meta();
  MIXPREC_CHECK(grad.shape() == leaf.shape(), "backward: gradient ", describe(grad),
                " does not match the leaf ", describe(leaf));
  const DType grad_dtype = meta.grad_dtype.value_or(leaf.dtype());
  const bool fresh = !meta.grad.defined() || mode == GradMode::Overwrite;
  // Deferred when the gradient is 16-bit and lands in an F32 .grad (a fresh one, or one
  // already F32: a .grad of another dtype given by set_grad fails at its leaf, as before).
  if (widenings != nullptr && grad_dtype == DType::F32 &&
      (grad.dtype() == DType::F16 || grad.dtype() == DType::BF16) &&
      (fresh || meta.grad.dtype() == DType::F32)) {
    if (fresh) {
      meta.grad = Tensor::empty(leaf.shape(), DType::F32, leaf.device());
    } else {
      meta.grad.mark_modified();
    }
    widenings->add(grad, meta.grad, !fresh);
  } else {
    const Tensor g = grad.to(grad_dtype);
    if (fresh) {
      // A private copy: the incoming tensor may be shared with other parts of the graph.
      meta.grad = g.is_same(grad) ? g.clone() : g;
    } else {
      backend_for(leaf.device()).binary(BinaryOp::Add, meta.grad, g, meta.grad);
      meta.grad.mark_modified();
    }
  }
  // Either a fresh buffer, zeros, or a sum of gradients of this scale (check_grad_scale ran
  // before the pass started).
  meta.grad_scale = loss_scale;
  meta.grad_zeroed = false;
}

}  // namespace mixprec
