#include "layers/dropout.h"

#include <utility>

#include "core/error.h"
#include "core/ops/ops.h"

namespace mixprec {

Dropout::Dropout(double p, std::shared_ptr<Generator> gen) : p_(p), gen_(std::move(gen)) {
  MIXPREC_CHECK(p >= 0.0 && p < 1.0, "Dropout: p must be in [0, 1), got ", p);
  MIXPREC_CHECK(gen_ != nullptr || p == 0.0, "Dropout(p=", p,
                "): needs a generator for its masks, got none");
}

Tensor Dropout::forward(const Tensor& x) {
  // Without a mask to draw the op is the identity and needs no generator (gen_ may be null).
  if (p_ == 0.0 || !is_training()) return x;
  return ops::dropout(x, p_, true, *gen_);
}

Tensor Dropout::added_to(const Tensor& residual, const Tensor& x) {
  if (has_forward_hook() || p_ == 0.0 || !is_training()) return residual + (*this)(x);
  return ops::dropout_add(residual, x, p_, true, *gen_);
}

std::string Dropout::describe() const { return detail::concat("Dropout(p=", p_, ")"); }

}  // namespace mixprec
