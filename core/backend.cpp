#include "core/backend.h"

#include <array>

#include "core/backend_checks.h"

#include "core/cpu/cpu_backend.h"
#include "core/error.h"

namespace mixprec {
namespace {

struct Registry {
  std::array<std::unique_ptr<Backend>, 2> backends;
  Registry() { backends[static_cast<size_t>(DeviceType::CPU)] = std::make_unique<CpuBackend>(); }
};

Registry& registry() {
  static Registry instance;
  return instance;
}

}  // namespace

// The per-parameter calls in order, once every step is checked.
void Backend::adam_steps(const std::vector<AdamParamStep>& steps, const Tensor* taken,
                         const Tensor* found_inf) {
  backend_checks::adam_steps(device(), steps, taken, found_inf);
  for (const AdamParamStep& s : steps) {
    if (taken == nullptr) {
      adam_step(s.hyper, *s.master, *s.grad, *s.exp_avg, *s.exp_avg_sq, s.working, found_inf);
    } else {
      adam_step_deferred(s.hyper, *s.table, *taken, *s.master, *s.grad, *s.exp_avg,
                         *s.exp_avg_sq, s.working, *found_inf);
    }
  }
}

void Backend::sgd_steps(const std::vector<SgdParamStep>& steps, const Tensor* taken,
                        const Tensor* found_inf) {
  backend_checks::sgd_steps(device(), steps, taken, found_inf);
  for (const SgdParamStep& s : steps) {
    if (taken == nullptr) {
      sgd_step(s.hyper, *s.master, *s.grad, s.momentum, s.working, found_inf);
    } else {
      sgd_step_deferred(s.hyper, *s.table, *taken, *s.master, *s.grad, s.momentum, s.working,
                        *found_inf);
    }
  }
}

Backend& backend_for(Device device) {
  Backend* backend = registry().backends[static_cast<size_t>(device.type)].get();
  MIXPREC_CHECK(backend != nullptr, "no backend for device ", device,
                ": this build has no CUDA backend, or no CUDA device was found");
  return *backend;
}

bool has_backend(DeviceType type) {
  return registry().backends[static_cast<size_t>(type)] != nullptr;
}

// Not synchronised: backends are registered once at start-up, before any tensor exists.
void register_backend(DeviceType type, std::unique_ptr<Backend> backend) {
  registry().backends[static_cast<size_t>(type)] = std::move(backend);
}

}  // namespace mixprec
