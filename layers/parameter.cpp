// Parameter: the FP32 master and its working copy, behind one shared handle.
//
// Under F16/BF16 only the working copy takes part in the forward pass, so only it requires
// grad; the master is then a plain leaf that the optimizer writes. Under F32 the master is
// the working tensor and carries requires_grad itself. Both tensors carry the parameter's
// name, so anomaly reports and GradScaler's non-finite lists say which parameter it was.
#include "layers/parameter.h"

#include <utility>

#include "core/backend.h"
#include "core/error.h"

namespace mixprec {

struct Parameter::Impl {
  std::string name;
  Tensor master;
  Tensor working;
  DType working_dtype = DType::F32;
  bool requires_grad = true;
};

Parameter::Parameter(std::string name, const Tensor& value) {
  MIXPREC_CHECK(!name.empty(), "Parameter: the name must not be empty (it names the parameter in "
                "checkpoints and messages)");
  MIXPREC_CHECK(value.defined(), "Parameter '", name, "': the initial value is undefined");
  MIXPREC_CHECK(is_floating(value.dtype()), "Parameter '", name, "': the initial value ",
                describe(value), " must be F32, F16 or BF16");
  impl_ = std::make_shared<Impl>();
  impl_->name = std::move(name);
  Tensor master = Tensor::empty(value.shape(), DType::F32, value.device());
  master.copy_(value.detach());
  master.set_requires_grad(true);
  master.set_name(impl_->name);
  impl_->master = master;
  impl_->working = master;
}

void Parameter::require_defined(const char* what) const {
  MIXPREC_CHECK(impl_ != nullptr, "Parameter::", what,
                ": the parameter is undefined (default-constructed); construct it with a name "
                "and a value");
}

const std::string& Parameter::name() const {
  require_defined("name");
  return impl_->name;
}

void Parameter::set_name(std::string name) {
  require_defined("set_name");
  MIXPREC_CHECK(!name.empty(), "Parameter '", impl_->name, "': set_name needs a non-empty name "
                "(it names the parameter in checkpoints and messages)");
  Impl& p = *impl_;
  p.name = std::move(name);
  p.master.set_name(p.name);
  if (!p.working.is_same(p.master)) p.working.set_name(p.name);
}

const Shape& Parameter::shape() const {
  require_defined("shape");
  return impl_->master.shape();
}

Device Parameter::device() const {
  require_defined("device");
  return impl_->master.device();
}

int64_t Parameter::numel() const {
  require_defined("numel");
  return impl_->master.numel();
}

Tensor Parameter::master() const {
  require_defined("master");
  return impl_->master;
}

Tensor Parameter::working() const {
  require_defined("working");
  return impl_->working;
}

DType Parameter::working_dtype() const {
  require_defined("working_dtype");
  return impl_->working_dtype;
}

void Parameter::set_working_dtype(DType dtype) {
  require_defined("set_working_dtype");
  MIXPREC_CHECK(is_floating(dtype), "Parameter '", impl_->name, "': the working dtype must be F32, "
                "F16 or BF16, got ", dtype);
  Impl& p = *impl_;
  p.working.reset_grad();
  p.master.reset_grad();
  if (dtype == DType::F32) {
    p.working = p.master;
    p.master.set_requires_grad(p.requires_grad);
  } else {
    Tensor working = Tensor::empty(p.master.shape(), dtype, p.master.device());
    if (working.numel() > 0) backend_for(working.device()).cast(p.master, working);
    working.set_requires_grad(p.requires_grad);
    working.set_grad_dtype(DType::F32);
    working.set_name(p.name);
    p.master.set_requires_grad(false);
    p.working = working;
  }
  p.working_dtype = dtype;
}

void Parameter::refresh_working() {
  require_defined("refresh_working");
  Impl& p = *impl_;
  if (p.working_dtype == DType::F32) return;
  if (p.working.numel() > 0) backend_for(p.working.device()).cast(p.master, p.working);
  // A graph that saved the old working values must not run its backward with the new ones.
  p.working.mark_modified();
}

Tensor Parameter::grad() const {
  require_defined("grad");
  return impl_->working.grad();
}

void Parameter::zero_grad(bool set_to_none) {
  require_defined("zero_grad");
  Tensor& working = impl_->working;
  if (set_to_none) {
    working.reset_grad();
    return;
  }
  working.zero_grad();
}

bool Parameter::requires_grad() const {
  require_defined("requires_grad");
  return impl_->requires_grad;
}

void Parameter::set_requires_grad(bool requires_grad) {
  require_defined("set_requires_grad");
  impl_->requires_grad = requires_grad;
  impl_->working.set_requires_grad(requires_grad);
}

}  // namespace mixprec
