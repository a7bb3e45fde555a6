// Global-norm gradient clipping: per-tensor sums of squares on the gradients' backend,
// combined in double on the host, or on the device by clip_grad_norm_on_device.
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

// The gradients of `params` by device, after clip_grad_norm's checks.
std::vector<DeviceGrads> grads_by_device(const std::vector<Parameter>& params, double max_norm,
                                         ClipOptions options) {
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
  return groups;
}

Tensor squared_sums(DeviceGrads& group) {
  Tensor sums = Tensor::empty({static_cast<int64_t>(group.grads.size())}, DType::F32, group.device);
  backend_for(group.device).squared_norms(group.grads, sums);
  return sums;
}

}  // namespace

double clip_grad_norm(const std::vector<Parameter>& params, double max_norm, ClipOptions options) {
  std::vector<DeviceGrads> groups = grads_by_device(params, max_norm, options);
  double total = 0.0;
  for (DeviceGrads& group : groups) {
    for (float s : squared_sums(group).to_float_vector()) total += static_cast<double>(s);
  }
  const double norm = std::sqrt(total);
  if (!std::isfinite(norm)) {
    MIXPREC_CHECK(!options.error_if_nonfinite, "clip_grad_norm: the total gradient norm is ", norm,
                  "; a gradient holds Inf or NaN (check the loss scale or enable anomaly mode "
                  "to find the op)");
    return norm;
  }
  const double coef = clip_coefficient(norm, max_norm);
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

Tensor clip_grad_norm_on_device(const std::vector<Parameter>& params, double max_norm,
                                ClipOptions options) {
  MIXPREC_CHECK(!options.error_if_nonfinite, "clip_grad_norm_on_device: error_if_nonfinite "
                "needs the norm on the host; use clip_grad_norm");
  std::vector<DeviceGrads> groups = grads_by_device(params, max_norm, options);
  MIXPREC_CHECK(!groups.empty(), "clip_grad_norm_on_device: no parameter has a gradient");
  MIXPREC_CHECK(groups.size() == 1, "clip_grad_norm_on_device: the gradients must be on one "
                "device, found them on ", groups.size(), " devices");
  DeviceGrads& group = groups.front();
  Tensor norm = Tensor::empty({1}, DType::F32, group.device);
  backend_for(group.device).clip_by_total_norm(group.grads, squared_sums(group), max_norm, norm);
  for (Tensor& g : group.grads) g.mark_modified();
  return norm;
}

}  // namespace mixprec
