#include "core/backend.h"

#include <array>

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
