// Optimizer base: parameter bookkeeping, the step loop and the learning rate.
#include "optim/optimizer.h"

#include <cmath>
#include <limits>
#include <utility>

#include "core/error.h"

namespace mixprec {

Optimizer::Optimizer(std::vector<Parameter> params, std::string name)
    : params_(std::move(params)), name_(std::move(name)) {
  MIXPREC_CHECK(!params_.empty(), "optimizer '", name_, "': the parameter list is empty; pass the "
                "model's parameters");
  for (size_t i = 0; i < params_.size(); ++i) {
    MIXPREC_CHECK(params_[i].defined(), "optimizer '", name_, "': parameter ", i,
                  " is undefined (default-constructed)");
    for (size_t j = 0; j < i; ++j) {
      // Listed twice, it would be updated twice per step.
      MIXPREC_CHECK(!params_[j].is_same(params_[i]), "optimizer '", name_, "': parameter '",
                    params_[i].name(), "' is listed twice (positions ", j, " and ", i,
                    "); pass each parameter once");
    }
  }
}

void Optimizer::step() {
  // Every check runs before the first update, so a misuse leaves all parameters untouched.
  for (const Parameter& p : params_) {
    if (!p.requires_grad() || !p.grad().defined()) continue;
    const double scale = p.working().grad_scale();
    MIXPREC_CHECK(scale == 1.0, "optimizer '", name_, "': the gradient of '", p.name(),
                  "' still carries a loss scale of ", scale, "; call scaler.step(optimizer) "
                  "(or scaler.unscale(optimizer) first) instead of optimizer.step()");
    const Tensor grad = p.grad();
    const Tensor master = p.master();
    MIXPREC_CHECK(grad.dtype() == DType::F32 && grad.shape() == master.shape() &&
                      grad.device() == master.device(),
                  "optimizer '", name_, "': the gradient of '", p.name(), "' is ", describe(grad),
                  " but the optimizer needs an F32 gradient shaped like its master ",
                  describe(master));
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const Parameter& p = params_[i];
    if (!p.requires_grad()) continue;
    const Tensor grad = p.grad();
    if (!grad.defined()) continue;
    update(i, p, grad);
  }
  ++steps_taken_;
}

void Optimizer::zero_grad(bool set_to_none) {
  for (Parameter& p : params_) p.zero_grad(set_to_none);
}

void Optimizer::set_lr(double lr) {
  // The update runs in FP32: a rate beyond its range would turn every weight into Inf/NaN.
  MIXPREC_CHECK(std::isfinite(lr) && lr >= 0.0 && lr <= std::numeric_limits<float>::max(),
                "optimizer '", name_, "': the learning rate must be finite, non-negative and "
                "within FP32's range, got ", lr);
  lr_ = lr;
}

}  // namespace mixprec
