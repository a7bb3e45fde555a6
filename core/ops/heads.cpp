// split_heads: the q, k and v heads [B, H, T, D] of a fused projection qkv [B, T, 3 * H * D]
// in one backend call (Backend::split_heads), where split, reshape and permute would copy
// every value twice in six calls; the gradient merges the three heads' gradients back in one
// call (Backend::merge_heads). Values move unchanged, so the results are bit for bit those
// of the composition.
#include <string>
#include <vector>

#include "core/autograd/record.h"
#include "core/backend.h"
#include "core/ops/checks.h"
#include "core/ops/narrow.h"
#include "core/ops/ops.h"

namespace mixprec::ops {
namespace {

struct SplitHeadsBackward final : Node {
  Shape input_shape;
  std::string name() const override { return "split_heads"; }
  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    const Tensor& first = grads[0];
    Tensor gx = Tensor::empty(input_shape, first.dtype(), first.device());
    backend_for(first.device()).merge_heads(grads[0], grads[1], grads[2], gx);
    return {gx};
  }
};

}  // namespace

std::vector<Tensor> split_heads(const Tensor& qkv, int64_t n_head) {
  check_layout_input("split_heads", qkv);
  MIXPREC_CHECK(qkv.dim() == 3 && n_head >= 1 && qkv.size(2) % (3 * n_head) == 0,
                "split_heads: expects qkv [B, T, 3 * n_head * D] with n_head >= 1, got ",
                describe(qkv), " and n_head ", n_head);
  const int64_t b = qkv.size(0), t = qkv.size(1), d = qkv.size(2) / (3 * n_head);
  std::vector<Tensor> heads;
  for (int i = 0; i < 3; ++i) {
    heads.push_back(Tensor::empty({b, n_head, t, d}, qkv.dtype(), qkv.device()));
  }
  backend_for(qkv.device()).split_heads(qkv, heads[0], heads[1], heads[2]);
  if (auto node = make_node<SplitHeadsBackward>({&qkv})) {
    node->input_shape = qkv.shape();
    for (int i = 0; i < 3; ++i) attach_output(node, heads[static_cast<size_t>(i)], i);
  }
  return heads;
}

}  // namespace mixprec::ops
