// dropout: zeroes each element with probability p and scales the survivors by 1 / (1 - p).
// The mask is never stored: it is a function of the Philox key reserved from the generator,
// and the backward replays the same key on the gradient.
#include <cmath>

#include "core/autograd/record.h"
#include "core/backend.h"
#include "core/generator.h"
#include "core/ops/checks.h"
#include "core/ops/ops.h"

namespace mixprec::ops {
namespace {

struct DropoutBackward final : Node {
  PhiloxKey key;
  float p = 0.0f;
  std::string name() const override { return "dropout"; }
  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    const Tensor& dy = grads[0];
    Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
    backend_for(dy.device()).dropout(dy, p, key, dx);
    return {dx};
  }
};

}  // namespace

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  check_floating("dropout", x, /*allow_empty=*/true);
  MIXPREC_CHECK(p >= 0.0 && static_cast<float>(p) < 1.0f, "dropout: p must be in [0, 1), got ", p, " for ",
                describe(x));
  if (!training || p == 0.0 || x.numel() == 0) return x;
  const PhiloxKey key = gen.next(static_cast<uint64_t>(x.numel()));
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  backend_for(x.device()).dropout(x, static_cast<float>(p), key, y);
  if (auto node = make_node<DropoutBackward>({&x})) {
    node->key = key;
    node->p = static_cast<float>(p);
    attach_output(node, y);
  }
  check_forward("dropout", y);
  return y;
}

}  // namespace mixprec::ops
