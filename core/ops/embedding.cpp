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
  DType weight_dtype = DType::F32;
  std::string name() const override { return "embedding"; }
  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    const Tensor dy = grads[0].dtype() == weight_dtype ? grads[0] : grads[0].to(weight_dtype);
    Tensor dweight = Tensor::empty(weight_shape, weight_dtype, dy.device());
    backend_for(dy.device()).embedding_backward(ids, dy, dweight);
    return {dweight};
  }
  void release_saved() override { ids = Tensor(); }
};

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  check_floating("embedding", weight);
  check_rank("embedding", weight, 2, "weight [V, D]");
  MIXPREC_CHECK(ids.defined(), "embedding: ids is an undefined tensor");
  MIXPREC_CHECK(ids.dtype() == DType::I32, "embedding: ids must be I32 token indices, got ",
                describe(ids));
  MIXPREC_CHECK(ids.device() == weight.device(), "embedding: ids ", describe(ids),
                " and weight ", describe(weight), " are on different devices");
  MIXPREC_CHECK(ids.numel() > 0, "embedding: ids ", describe(ids), " is empty");
  check_indices("embedding", ids, weight.size(0), "ids");

  Shape out_shape = ids.shape();
  out_shape.push_back(weight.size(1));
  Tensor y = Tensor::empty(out_shape, weight.dtype(), weight.device());
  backend_for(weight.device()).embedding(weight, ids, y);
  if (auto node = make_node<EmbeddingBackward>({&weight})) {
    node->ids = save_for_backward(*node, ids);
    node->weight_shape = weight.shape();
    node->weight_dtype = weight.dtype();
    attach_output(node, y);
  }
  check_forward("embedding", y);
  return y;
}

}  // namespace mixprec::ops
