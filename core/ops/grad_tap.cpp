// grad_tap: the identity in the graph that hands its incoming gradient to a callback on the
// way through. It is how a caller observes an activation gradient, which otherwise exists
// only inside the engine's buffers for the length of one node (mixprec inspect gathers every
// layer's output gradient this way).
#include <utility>

#include "core/autograd/record.h"
#include "core/ops/ops.h"
#include "core/ops/view.h"

namespace mixprec::ops {
namespace {

struct GradTapBackward final : Node {
  std::function<void(const Tensor&)> on_grad;
  std::string name() const override { return "grad_tap"; }
  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    flush_pending_widenings();  // the callback may read leaves' .grad
    on_grad(grads[0]);
    // Passed on as it came: the engine never writes into a gradient it handed out, so the
    // callback and the next node can share it.
    return {grads[0]};
  }
  // The callback may hold state of the caller (a collector); drop it with the graph.
  void release_saved() override { on_grad = nullptr; }
};

}  // namespace

Tensor grad_tap(const Tensor& x, std::function<void(const Tensor& grad)> on_grad) {
  MIXPREC_CHECK(x.defined(), "grad_tap: input is an undefined tensor");
  MIXPREC_CHECK(on_grad != nullptr, "grad_tap: the callback for ", describe(x), " is empty");
  auto node = make_node<GradTapBackward>({&x});
  if (!node) return x;  // no gradient will ever arrive: nothing to tap
  // A second handle on x's storage, so the tap costs no copy; the node makes it a new
  // tensor in the graph.
  Tensor y = view_as_shape(x, x.shape());
  node->on_grad = std::move(on_grad);
  attach_output(node, y);
  return y;
}

}  // namespace mixprec::ops
