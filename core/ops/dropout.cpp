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

// The forward's mask, replayed from its key on the gradient.
struct MaskedBackward : Node {
  PhiloxKey key;
  float p = 0.0f;
  Tensor masked(const Tensor& dy) const {
    Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
    backend_for(dy.device()).dropout(dy, p, key, dx);
    return dx;
  }
};

struct DropoutBackward final : MaskedBackward {
  std::string name() const override { return "dropout"; }
  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    return {masked(grads[0])};
  }
};

// The residual's gradient is dy itself; x's is dy through the same mask.
struct DropoutAddBackward final : MaskedBackward {
  std::string name() const override { return "dropout_add"; }
  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    if (!next_edges[1].valid()) return {grads[0], Tensor()};  // x takes no gradient
    return {grads[0], masked(grads[0])};
  }
};

void check_p(const char* op, double p, const Tensor& x) {
  MIXPREC_CHECK(p >= 0.0 && static_cast<float>(p) < 1.0f, op, ": p must be in [0, 1), got ", p,
                " for ", describe(x));
}

}  // namespace

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  check_floating("dropout", x, /*allow_empty=*/true);
  check_p("dropout", p, x);
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

Tensor dropout_add(const Tensor& residual, const Tensor& x, double p, bool training,
                   Generator& gen) {
  check_floating("dropout_add", x, /*allow_empty=*/true);
  check_floating("dropout_add", residual, /*allow_empty=*/true);
  check_same_dtype_device("dropout_add", {&residual, &x});
  MIXPREC_CHECK(residual.shape() == x.shape(), "dropout_add: residual ", describe(residual),
                " and x ", describe(x), " must have one shape");
  check_p("dropout_add", p, x);
  if (!training || p == 0.0 || x.numel() == 0) return add(residual, x);
  const PhiloxKey key = gen.next(static_cast<uint64_t>(x.numel()));
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  backend_for(x.device()).dropout_add(residual, x, static_cast<float>(p), key, y);
  if (auto node = make_node<DropoutAddBackward>({&residual, &x})) {
    node->key = key;
    node->p = static_cast<float>(p);
    attach_output(node, y);
  }
  check_forward("dropout_add", y);
  return y;
}

}  // namespace mixprec::ops
