// Module: the base of every layer and model, with torch.nn.Module's habits.
//
// - A module owns named parameters (Parameter: FP32 master + working copy), named buffers
//   (plain tensors that are saved but not trained: BatchNorm's running statistics) and named
//   children. Names compose with dots, children first in registration order, exactly as
//   torch.nn.Module.named_parameters()/state_dict() order them, so a state dict written from
//   here loads into the equivalent torch model with load_state_dict(strict=True).
// - Registration happens in the constructor of the concrete module. After the whole tree is
//   built, the root calls assign_names() once so that every Parameter carries its full dotted
//   name ("0.weight", "transformer.h.0.attn.c_attn.weight"); GradScaler and optimizers name
//   tensors in messages by that name.
// - forward() takes one tensor: images [N, C, H, W] (floating) for CNNs, token ids I32 [B, T]
//   for GPT. The module casts nothing: the caller hands inputs in the working dtype (ids stay
//   I32), and every layer reads its parameters through Parameter::working().
// - A module is called as module(input) (operator()), which runs forward() and then the
//   module's forward hook, if one is set. Containers call their children that way, so a hook
//   on any module of a model sees each of its outputs (mixprec inspect taps activation
//   gradients with it); forward() called directly bypasses the hook.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "layers/parameter.h"

namespace mixprec {

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  virtual Tensor forward(const Tensor& input) = 0;
  // forward(input), handed to the forward hook when one is set: the caller gets what the hook
  // returns.
  Tensor operator()(const Tensor& input);

  // Called by operator() with every output of forward(); returns the tensor the caller gets
  // (the output itself, or a tensor derived from it such as ops::grad_tap(output, ...)). One
  // hook per module: setting one replaces the previous, an empty function removes it. The
  // hook is not part of the module's state (state_dict, describe) and children do not
  // inherit it.
  using ForwardHook = std::function<Tensor(const Tensor& output)>;
  void set_forward_hook(ForwardHook hook) { forward_hook_ = std::move(hook); }
  bool has_forward_hook() const { return static_cast<bool>(forward_hook_); }
  // A short description for logs, e.g. "Linear(in_features=128, out_features=10, bias=true)".
  virtual std::string describe() const = 0;

  // Training mode (dropout active, batch statistics) for this module and every child.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Recursive, in registration order, children after own entries at each level exactly as
  // torch does (own parameters first, then each child's, depth first). A parameter shared
  // under two names (tied weights) is listed once, under its first name, as torch does.
  std::vector<std::pair<std::string, Parameter>> named_parameters() const;
  std::vector<Parameter> parameters() const;
  std::vector<std::pair<std::string, Tensor>> named_buffers() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  int64_t parameter_count() const;  // elements over all parameters

  // Parameters (their FP32 masters, shared, not copied) and buffers, interleaved per module in
  // torch's order: a module's own parameters, then its own buffers, then each child's entries.
  // A parameter registered twice under two names (tied weights) appears under both names.
  std::vector<std::pair<std::string, Tensor>> state_dict() const;
  // Copies values into the masters (then refreshes the working copies) and buffers. Values may
  // be any floating dtype for floating entries and I32 for integer buffers; they are converted.
  // strict: a missing name, an unexpected name or a shape mismatch throws, listing every
  // problem (missing, unexpected, "name: expected [..] got [..]") before anything is written.
  // Non-strict: only shape mismatches throw; missing and unexpected names are ignored.
  void load_state_dict(const std::map<std::string, Tensor>& state, bool strict = true);

  // Gives every Parameter its full dotted name, and every module below this one its path
  // ("transformer.h.0.attn"), which names the layer of the ops it records when it is called
  // (errors, anomaly mode). Called once by the code that builds the root.
  void assign_names(const std::string& prefix = "");
  // The module's dotted path from the root, "" for the root and before assign_names.
  const std::string& path() const { return path_; }

 protected:
  // Registers `value` as a parameter (a new Parameter whose master is an F32 copy).
  Parameter register_parameter(const std::string& name, const Tensor& value);
  // Registers an existing parameter under a new name (weight tying).
  void register_shared_parameter(const std::string& name, const Parameter& param);
  // Registers a buffer; the returned reference stays valid for the module's life and is the
  // tensor that state_dict() returns and load_state_dict() writes into.
  Tensor& register_buffer(const std::string& name, const Tensor& value);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> child) {
    add_child(name, child);
    return child;
  }

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> child);
  void collect_state(const std::string& prefix,
                     std::vector<std::pair<std::string, Tensor>>& out) const;
  void collect_parameters(const std::string& prefix,
                          std::vector<std::pair<std::string, Parameter>>& out) const;
  void collect_buffers(const std::string& prefix,
                       std::vector<std::pair<std::string, Tensor>>& out) const;

  void assign_paths(const std::string& path);

  bool training_ = true;
  std::string path_;
  ForwardHook forward_hook_;
  std::vector<std::pair<std::string, Parameter>> parameters_;
  // unique_ptr so that references handed out by register_buffer stay valid.
  std::vector<std::pair<std::string, std::unique_ptr<Tensor>>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

}  // namespace mixprec
