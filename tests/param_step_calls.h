// One parameter's optimizer update, as a call of Backend::sgd_steps / adam_steps with one step:
// the multi-tensor calls are the backends' only form of the update, and these keep the tests
// of a single parameter's arithmetic, checks and skip short. `taken` and the rate table make
// the deferred form (the per-step values picked on the device).
#pragma once

#include "core/backend.h"

namespace mixprec_test {

inline void sgd_step_on(mixprec::Backend& backend, const mixprec::SgdHyper& hyper,
                        mixprec::Tensor& master, const mixprec::Tensor& grad,
                        mixprec::Tensor* momentum, mixprec::Tensor* working,
                        const mixprec::Tensor* found_inf) {
  backend.sgd_steps({{hyper, nullptr, &master, &grad, momentum, working}}, nullptr, found_inf);
}

inline void adam_step_on(mixprec::Backend& backend, const mixprec::AdamHyper& hyper,
                         mixprec::Tensor& master, const mixprec::Tensor& grad,
                         mixprec::Tensor& exp_avg, mixprec::Tensor& exp_avg_sq,
                         mixprec::Tensor* working, const mixprec::Tensor* found_inf) {
  backend.adam_steps({{hyper, nullptr, &master, &grad, &exp_avg, &exp_avg_sq, working}}, nullptr,
                     found_inf);
}

inline void sgd_step_deferred_on(mixprec::Backend& backend, const mixprec::SgdHyper& base,
                                 const mixprec::SgdRateTable& table, const mixprec::Tensor& taken,
                                 mixprec::Tensor& master, const mixprec::Tensor& grad,
                                 mixprec::Tensor* momentum, mixprec::Tensor* working,
                                 const mixprec::Tensor& found_inf) {
  backend.sgd_steps({{base, &table, &master, &grad, momentum, working}}, &taken, &found_inf);
}

inline void adam_step_deferred_on(mixprec::Backend& backend, const mixprec::AdamHyper& base,
                                  const mixprec::AdamRateTable& table,
                                  const mixprec::Tensor& taken, mixprec::Tensor& master,
                                  const mixprec::Tensor& grad, mixprec::Tensor& exp_avg,
                                  mixprec::Tensor& exp_avg_sq, mixprec::Tensor* working,
                                  const mixprec::Tensor& found_inf) {
  backend.adam_steps({{base, &table, &master, &grad, &exp_avg, &exp_avg_sq, working}}, &taken,
                     &found_inf);
}

}  // namespace mixprec_test
