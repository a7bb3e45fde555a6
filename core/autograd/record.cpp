#include "core/autograd/record.h"

#include "core/backend.h"
#include "core/error.h"

namespace mixprec {

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  AutogradMeta& meta = t.autograd_meta();
  if (meta.grad_fn) return {meta.grad_fn, meta.output_nr};
  std::shared_ptr<AccumulateGrad> acc = meta.accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    acc->outputs.push_back({t.shape(), t.dtype(), t.device()});
    meta.accumulator = acc;
  }
  return {acc, 0};
}

bool any_requires_grad(std::initializer_list<const Tensor*> inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor* t : inputs)
    if (t && t->requires_grad()) return true;
  return false;
}

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.requires_grad()) return true;
  return false;
}

Tensor save_for_backward(Node& node, const Tensor& t) {
  if (!t.defined()) return Tensor();
  const std::shared_ptr<Storage>& storage = t.impl()->storage;
  node.saved_versions.push_back({storage, storage->version()});
  return t.detach();
}

void attach_output(const std::shared_ptr<Node>& node, Tensor& out, int output_nr) {
  AutogradMeta& meta = out.autograd_meta();
  meta.requires_grad = true;
  meta.grad_fn = node;
  meta.output_nr = output_nr;
  if (static_cast<int>(node->outputs.size()) <= output_nr) node->outputs.resize(output_nr + 1);
  node->outputs[output_nr] = {out.shape(), out.dtype(), out.device()};
}

void check_forward(const char* op, const Tensor& out) {
  if (!anomaly_mode_enabled() || !is_floating(out.dtype())) return;
  if (backend_for(out.device()).all_finite(out)) return;
  MIXPREC_FAIL("anomaly: the output of ", op_label(op, current_layer_name()),
               " contains Inf or NaN (", describe(out), ")");
}

std::string op_label(const std::string& op, const std::string& layer) {
  std::string label = "'" + op + "'";
  if (!layer.empty()) label.append(" in layer '").append(layer).append("'");
  return label;
}

}  // namespace mixprec
