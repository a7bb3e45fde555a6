// The recorded graph. Each differentiable op creates one Node subclass (in its own file in
// core/ops/) holding what its backward needs; edges point at the nodes that produced the
// op's inputs. Leaves that require grad are reached through an AccumulateGrad node.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mixprec {

class AccumulateGrad;
class Node;

struct Edge {
  std::shared_ptr<Node> node;  // null when that input needs no gradient
  int input_nr = 0;            // which output of `node` the input was
  bool valid() const { return node != nullptr; }
};

// Shape, dtype and device of one output, so the engine can make a zero gradient for an
// output that received none (e.g. an unused piece of a split).
struct OutputMeta {
  Shape shape;
  DType dtype = DType::F32;
  Device device;
};

// The storage of a tensor saved for backward and its version when it was saved
// (record.h: save_for_backward). The engine compares the two before running the node.
struct SavedVersion {
  std::shared_ptr<const Storage> storage;
  uint64_t version = 0;
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  // Releases the chain of producers iteratively: a recursive release of a 10^5-op graph
  // would overflow the stack.
  virtual ~Node();
  // The op's name ("matmul", "layer_norm", ...), used in errors and anomaly reports.
  virtual std::string name() const = 0;
  // Gradients w.r.t. each input (same order as next_edges; undefined where not needed),
  // given the gradient w.r.t. each output. Called at most once per backward pass.
  virtual std::vector<Tensor> apply(const std::vector<Tensor>& grad_outputs) = 0;
  // Frees the tensors saved for backward (see release()).
  virtual void release_saved() {}
  // Called by the engine after apply unless retain_graph: frees the saved tensors and their
  // versions and marks the node released, so that a second backward through it throws
  // instead of reading freed tensors. Does nothing for a node that keeps_graph().
  void release();
  // True for a node that must stay usable after a backward without retain_graph (a leaf's
  // accumulator, shared by every graph that uses the leaf and saving nothing).
  virtual bool keeps_graph() const { return false; }
  // This node as a leaf's accumulator, or null: the engine hands such a sink its gradient
  // directly, with the pass's GradMode, instead of calling apply.
  virtual AccumulateGrad* as_accumulator() { return nullptr; }

  std::vector<Edge> next_edges;
  std::vector<OutputMeta> outputs;
  std::vector<SavedVersion> saved_versions;  // cleared with the saved tensors
  std::string layer;      // layer scope active when the op ran (may be empty)
  bool released = false;  // saved tensors were freed by an earlier backward
};

// The 16-bit gradients bound for F32 .grad buffers during one backward pass, widened
// together when it ends (Backend::widen_gradients): one call per device instead of a cast
// per leaf, which on a GPU is one launch for every parameter.
class PendingWidenings {
 public:
  PendingWidenings() = default;
  PendingWidenings(const PendingWidenings&) = delete;
  PendingWidenings& operator=(const PendingWidenings&) = delete;
  // destination (F32) becomes float(source), or destination + float(source) with
  // `accumulate`, at the next flush(). Both stay referenced until then.
  void add(const Tensor& source, const Tensor& destination, bool accumulate);
  // Widens everything added, in one widen_gradients call per device, and forgets it (also
  // when the call throws).
  void flush();

 private:
  struct Item {
    Tensor source, destination;
    bool accumulate = false;
  };
  std::vector<Item> items_;
};

// Widens what the backward pass running on this thread has gathered so far (nothing outside a
// pass). A node that hands control to user code during the pass (grad_tap's callback) calls
// it first, so the callback sees every leaf's .grad as complete as it was before the
// widenings were gathered, and a backward it starts itself finds no pending sum to clash
// with.
void flush_pending_widenings();

// Sink of a leaf tensor: adds (or writes, in GradMode::Overwrite) incoming gradients into
// the leaf's .grad. Accumulation is in place, as in PyTorch: a handle to .grad taken
// earlier sees the sum.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::weak_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {}
  std::string name() const override { return "accumulate_grad"; }
  // accumulate(grad_outputs[0], GradMode::Accumulate); returns no gradients.
  std::vector<Tensor> apply(const std::vector<Tensor>& grad_outputs) override;
  // Adds `grad` (the leaf's shape) into the leaf's .grad, converted to its grad dtype, or
  // replaces .grad with a private copy when there is none yet or `mode` is Overwrite. Does
  // nothing once the leaf is gone. Runs its arithmetic unrecorded.
  // `loss_scale` is the scale the backward's root carried; it becomes the .grad's tag.
  // With `widenings`, an F16/BF16 gradient bound for an F32 .grad is left there instead:
  // .grad is then its new buffer (or the existing one it will be added to), holding its
  // values only once the caller has flushed them, before anything reads .grad.
  void accumulate(const Tensor& grad, GradMode mode, double loss_scale = 1.0,
                  PendingWidenings* widenings = nullptr);
  // The leaf, or an undefined tensor once it is gone.
  Tensor leaf() const;
  bool keeps_graph() const override { return true; }
  AccumulateGrad* as_accumulator() override { return this; }

 private:
  std::weak_ptr<TensorImpl> leaf_;
};

struct AutogradMeta {
  bool requires_grad = false;
  std::shared_ptr<Node> grad_fn;  // null for leaves
  int output_nr = 0;
  Tensor grad;
  std::optional<DType> grad_dtype;
  std::weak_ptr<AccumulateGrad> accumulator;  // shared by all uses of a leaf in a graph
  std::string name;
  double loss_scale = 1.0;  // see Tensor::loss_scale()
  double grad_scale = 1.0;  // see Tensor::grad_scale()
  bool grad_zeroed = false;  // .grad holds zeros from zero_grad(): any scale may follow
};

}  // namespace mixprec
