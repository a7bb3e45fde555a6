// embedding: row lookup of weight [V, D] by I32 ids of any shape. The backward scatter-sums
// the output gradient into dweight [V, D] in a fixed order (repeated ids accumulate), so it
// is deterministic; ids get no gradient.
#include "core/autograd/record.h"
#include "core/backend.h"
#include "core/ops/checks.h"
#include "core/ops/ops.h"

namespace mixprec::ops {
namespace {

struct EmbeddingBackward final : Node {
  Tensor ids;
  Shape weight_shape;
  std::string name() const override { return "embedding"; }
  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    const Tensor& dy = grads[0];
    Tensor dweight = Tensor::empty(weight_shape, dy.dtype(), dy.device());
    backend_for(dy.device()).embedding_backward(ids, dy, dweight);
    return {dweight};
  }
  void release_saved() override { ids = Tensor(); }
};

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  check_floating("embedding", weight);
  check_rank("embedding", weight, 2, "weight [V, D]");
  check_indices("embedding", ids, weight.size(0), "ids", weight);
  MIXPREC_CHECK(ids.numel() > 0, "embedding: ids ", describe(ids), " is empty");

  Shape out_shape = ids.shape();
  out_shape.push_back(weight.size(1));
  Tensor y = Tensor::empty(out_shape, weight.dtype(), weight.device());
  backend_for(weight.device()).embedding(weight, ids, y);
  if (auto node = make_node<EmbeddingBackward>({&weight})) {
    node->ids = save_for_backward(*node, ids);
    node->weight_shape = weight.shape();
    attach_output(node, y);
  }
  check_forward("embedding", y);
  return y;
}

}  // namespace mixprec::ops
