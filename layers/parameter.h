// Parameter: a trainable value with an FP32 master and, under FP16/BF16, a low-precision
// working copy (DESIGN.md section 4).
//
// - master(): F32 leaf holding the truth. Optimizers update it; checkpoints store it.
// - working(): the tensor the forward pass uses. Under F32 it is the master itself; under
//   F16/BF16 it is a separate leaf, a rounded copy of the master, that requires grad and keeps
//   its .grad in an F32 buffer. Activation gradients stay in the working dtype (that is where
//   FP16 underflow happens); only parameter gradients are widened, and they accumulate there
//   still carrying the loss scale until GradScaler::unscale.
// - The optimizer rewrites the working copy from the new master in the same pass as the
//   update (Backend::sgd_step's `working`), so the two never drift apart.
//
// A Parameter is a shared handle, like Tensor: copies refer to the same value.
#pragma once

#include <memory>
#include <string>

#include "core/tensor.h"

namespace mixprec {

class Parameter {
 public:
  Parameter() = default;  // undefined
  // `value` (any floating dtype, any device) is copied into a new F32 master leaf that
  // requires grad; the working dtype starts as F32. Throws for an empty name or a
  // non-floating or undefined value.
  Parameter(std::string name, const Tensor& value);

  bool defined() const { return impl_ != nullptr; }
  const std::string& name() const;
  // Renames the parameter and its master and working tensors (Module::assign_names gives it
  // its full dotted name). Throws for an empty name.
  void set_name(std::string name);
  const Shape& shape() const;
  Device device() const;
  int64_t numel() const;

  Tensor master() const;
  Tensor working() const;
  DType working_dtype() const;
  // Switches the working dtype (F32, F16 or BF16). F32 makes the master its own working
  // copy; F16/BF16 make a fresh working leaf rounded from the master, with an F32 grad
  // buffer. Drops any existing gradient (it belonged to the previous working tensor).
  void set_working_dtype(DType dtype);
  // Rewrites the working copy from the master (nothing to do under F32). Optimizers that
  // update the master without writing the copy themselves call this.
  void refresh_working();

  // The F32 gradient buffer (working().grad()), or undefined before the first backward.
  Tensor grad() const;
  // Drops the gradient (set_to_none, PyTorch's default) or fills it with zeros.
  void zero_grad(bool set_to_none = true);

  // A frozen parameter (requires_grad false) receives no gradient and is skipped by
  // optimizers.
  bool requires_grad() const;
  void set_requires_grad(bool requires_grad);

  bool is_same(const Parameter& other) const { return impl_ == other.impl_; }

 private:
  struct Impl;
  void require_defined(const char* what) const;
  std::shared_ptr<Impl> impl_;
};

}  // namespace mixprec
