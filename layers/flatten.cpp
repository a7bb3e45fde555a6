#include "layers/flatten.h"

#include "core/error.h"
#include "core/ops/ops.h"

namespace mixprec {

Tensor Flatten::forward(const Tensor& x) { return ops::flatten(x, start_dim_, end_dim_); }

std::string Flatten::describe() const {
  return detail::concat("Flatten(start_dim=", start_dim_, ", end_dim=", end_dim_, ")");
}

}  // namespace mixprec
