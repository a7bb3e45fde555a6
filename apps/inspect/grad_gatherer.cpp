// Gathering for `mixprec inspect`: forward hooks tap each layer's output (ops::grad_tap), and
// the tapped gradients and the parameters' gradients are counted on the host as they come.
#include "apps/inspect/grad_gatherer.h"

#include <vector>

#include "apps/train/batch_loss.h"
#include "core/error.h"
#include "core/ops/ops.h"
#include "layers/transformer_block.h"

namespace mixprec::inspect {
namespace {

std::vector<float> host_values(const Tensor& t) {
  return t.to(DType::F32).to(kCPU).to_float_vector();
}

}  // namespace

GradGatherer::GradGatherer(Module& model, double scale) : model_(model), scale_(scale) {
  const GradHistogram empty = make_grad_histogram(scale);
  // Depth first in registration order, the order in which state_dict lists the modules.
  struct Pending {
    std::string path;
    std::shared_ptr<Module> module;
  };
  std::vector<Pending> stack;
  const auto children = model.named_children();
  for (auto it = children.rbegin(); it != children.rend(); ++it)
    stack.push_back({it->first, it->second});
  while (!stack.empty()) {
    Pending next = std::move(stack.back());
    stack.pop_back();
    const auto grandchildren = next.module->named_children();
    if (grandchildren.empty() || dynamic_cast<const Block*>(next.module.get()) != nullptr)
      layers_.push_back({next.path, next.module, empty});
    for (auto it = grandchildren.rbegin(); it != grandchildren.rend(); ++it)
      stack.push_back({next.path + "." + it->first, it->second});
  }
  for (const Layer& layer : layers_)
    MIXPREC_CHECK(!layer.module->has_forward_hook(), "inspect: layer '", layer.name,
                  "' already has a forward hook");
  for (size_t i = 0; i < layers_.size(); ++i) {
    layers_[i].module->set_forward_hook([this, i](const Tensor& output) {
      // Integer outputs carry no gradient; grad_tap returns an output that needs none as it is.
      if (!is_floating(output.dtype())) return output;
      return ops::grad_tap(output, [this, i](const Tensor& grad) { record(i, grad); });
    });
  }
  for (const auto& [name, param] : model.named_parameters())
    weights_.push_back({name, empty});
}

GradGatherer::~GradGatherer() {
  for (Layer& layer : layers_) layer.module->set_forward_hook(nullptr);
}

std::vector<std::string> GradGatherer::layer_names() const {
  std::vector<std::string> names;
  for (const Layer& layer : layers_) names.push_back(layer.name);
  return names;
}

void GradGatherer::record(size_t layer, const Tensor& grad) {
  const std::vector<float> values = host_values(grad);
  add_values(layers_[layer].histogram, values);
  profile_.add(values);
}

void GradGatherer::gather_batch(const Batch& batch, Device device) {
  const auto params = model_.named_parameters();
  MIXPREC_CHECK(params.size() == weights_.size(), "inspect: the model's parameters changed while "
                "gradients were gathered");
  for (const auto& [name, entry] : params) {
    Parameter param = entry;
    MIXPREC_CHECK(param.working_dtype() == DType::F32, "inspect: parameter '", name,
                  "' works in ", param.working_dtype(), "; gradients are gathered in FP32");
    param.zero_grad();
  }
  const BatchLoss out = batch_loss(model_, batch, device, DType::F32);
  out.loss.backward();
  for (size_t i = 0; i < params.size(); ++i) {
    Parameter param = params[i].second;
    const Tensor grad = param.grad();
    if (grad.defined()) {
      const std::vector<float> values = host_values(grad);
      add_values(weights_[i].histogram, values);
      profile_.add(values);
    }
    param.zero_grad();
  }
}

GatheredGradients GradGatherer::result() const {
  GatheredGradients out;
  for (const Layer& layer : layers_)
    if (layer.histogram.elements > 0) out.activations.push_back({layer.name, layer.histogram});
  out.weights = weights_;
  out.profile = profile_;
  return out;
}

}  // namespace mixprec::inspect
