// permute and transpose (a permute that swaps two dimensions). Tensors are always contiguous,
// so the data moves through Backend::permute; the gradient is permuted back by the inverse
// permutation. Whole elements move, so every dtype works (I32 ids included).
#include <string>
#include <utility>
#include <vector>

#include "core/autograd/record.h"
#include "core/backend.h"
#include "core/ops/dims.h"
#include "core/ops/narrow.h"
#include "core/ops/ops.h"

namespace mixprec::ops {
namespace {

Tensor permute_impl(const char* op, const Tensor& x, const std::vector<int64_t>& perm);

struct PermuteBackward final : Node {
  const char* op = "permute";
  std::vector<int64_t> inverse;
  std::string name() const override { return op; }
  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    return {permute_impl(op, grads[0], inverse)};
  }
};

// `perm` is already validated and non-negative.
Tensor permute_impl(const char* op, const Tensor& x, const std::vector<int64_t>& perm) {
  Shape shape(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) shape[i] = x.shape()[perm[i]];
  Tensor y = Tensor::empty(shape, x.dtype(), x.device());
  backend_for(x.device()).permute(x, perm, y);
  if (auto node = make_node<PermuteBackward>({&x})) {
    node->op = op;
    node->inverse.resize(perm.size());
    for (size_t i = 0; i < perm.size(); ++i) node->inverse[perm[i]] = static_cast<int64_t>(i);
    attach_output(node, y);
  }
  return y;
}

}  // namespace

Tensor permute(const Tensor& x, const std::vector<int64_t>& perm) {
  check_layout_input("permute", x);
  MIXPREC_CHECK(static_cast<int64_t>(perm.size()) == x.dim(), "permute: ", shape_str(perm),
                " has ", perm.size(), " entries but ", describe(x), " has ", x.dim(),
                " dimensions");
  return permute_impl("permute", x, normalize_dims("permute", perm, x));
}

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  check_layout_input("transpose", x);
  const int64_t d0 = wrap_dim("transpose", dim0, x);
  const int64_t d1 = wrap_dim("transpose", dim1, x);
  std::vector<int64_t> perm(x.dim());
  for (int64_t i = 0; i < x.dim(); ++i) perm[i] = i;
  std::swap(perm[d0], perm[d1]);
  return permute_impl("transpose", x, perm);
}

}  // namespace mixprec::ops
