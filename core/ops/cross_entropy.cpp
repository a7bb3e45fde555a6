// cross_entropy: mean over N of -log softmax(logits)[label], computed per row as
// (max - logit[label]) + log(sum exp(logit - max)) in FP32/double, so large logits neither
// overflow nor lose the small terms. The loss is an F32 scalar whatever the logits' dtype;
// the per-row (max, log-sum) pairs are kept for the backward.
#include "core/autograd/record.h"
#include "core/backend.h"
#include "core/ops/checks.h"
#include "core/ops/ops.h"

namespace mixprec::ops {
namespace {

struct CrossEntropyBackward final : Node {
  Tensor logits, labels, row_stats;
  std::string name() const override { return "cross_entropy"; }
  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    Tensor dlogits = Tensor::empty(logits.shape(), logits.dtype(), logits.device());
    backend_for(logits.device()).cross_entropy_backward(logits, labels, row_stats, grads[0],
                                                        dlogits);
    return {dlogits};
  }
  void release_saved() override {
    logits = Tensor();
    labels = Tensor();
    row_stats = Tensor();
  }
};

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& labels) {
  check_floating("cross_entropy", logits);
  check_rank("cross_entropy", logits, 2, "logits");
  check_indices("cross_entropy", labels, logits.size(1), "labels", logits);
  MIXPREC_CHECK(labels.dim() == 1 && labels.size(0) == logits.size(0),
                "cross_entropy: labels ", describe(labels), " must be [", logits.size(0),
                "] for logits ", describe(logits));

  const int64_t n = logits.size(0);
  Tensor loss = Tensor::empty({}, DType::F32, logits.device());
  Tensor row_stats = Tensor::empty({n, 2}, DType::F32, logits.device());
  backend_for(logits.device()).cross_entropy(logits, labels, loss, row_stats);
  if (auto node = make_node<CrossEntropyBackward>({&logits})) {
    node->logits = save_for_backward(*node, logits);
    node->labels = save_for_backward(*node, labels);
    node->row_stats = row_stats;
    attach_output(node, loss);
  }
  check_forward("cross_entropy", loss);
  return loss;
}

}  // namespace mixprec::ops
