// Global-norm gradient clipping: per-tensor sums of squares on the gradients' backend,
// combined in double on the host.
#include "optim/clip_grad_norm.h"

#include <cmath>
#include <vector>

#include "core/backend.h"
#include "core/error.h"

namespace mixprec {
namespace {

// Gradients per device, in parameter order.
struct DeviceGrads {
  Device device;
  std::vector<Tensor> grads;
};

}  // namespace

double clip_grad_norm(const std::vector<Parameter>& params, double max_norm, ClipOptions options) {
  MIXPREC_CHECK(std::isfinite(max_norm) && max_norm > 0.0,
                "clip_grad_norm: max_norm must be finite and positive, got ", max_norm);
  std::vector<DeviceGrads> groups;
  for (const Parameter& p : params) {
    MIXPREC_CHECK(p.defined(), "clip_grad_norm: an undefined (default-constructed) parameter was "
                  "passed");
    const Tensor grad = p.grad();
    if (!grad.defined()) continue;
    const double scale = p.working().grad_scale();
    MIXPREC_CHECK(options.allow_scaled || scale == 1.0, "clip_grad_norm: the gradient of '",
                  p.name(), "' still carries a loss scale of ", scale,
                  ", so its norm is the scaled one; call scaler.unscale(optimizer) before "
                  "clip_grad_norm");
    DeviceGrads* group = nullptr;
    for (DeviceGrads& g : groups)
      if (g.device == grad.device()) group = &g;
    if (group == nullptr) group = &groups.emplace_back(DeviceGrads{grad.device(), {}});
    group->grads.push_back(grad);
  }

  double total = 0.0;
  for (DeviceGrads& group : groups) {
    Tensor sums =
        Tensor::empty({static_cast<int64_t>(group.grads.size())}, DType::F32, group.device);
    backend_for(group.device).squared_norms(group.grads, sums);
    for (float s : sums.to_float_vector()) total += static_cast<double>(s);
  }
  const double norm = std::sqrt(total);
  if (!std::isfinite(norm)) {
    MIXPREC_CHECK(!options.error_if_nonfinite, "clip_grad_norm: the total gradient norm is ", norm,
                  "; a gradient holds Inf or NaN (check the loss scale or enable anomaly mode "
                  "to find the op)");
    return norm;
  }
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) {
    for (DeviceGrads& group : groups) {
      Backend& backend = backend_for(group.device);
      // affine loads each block before storing it, so scaling in place is safe.
      for (Tensor& g : group.grads) {
        backend.affine(g, static_cast<float>(coef), 0.0f, g);
        g.mark_modified();
      }
    }
  }
  return norm;
}

}  // namespace mixprec
