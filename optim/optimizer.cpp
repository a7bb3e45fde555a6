// Optimizer base: parameter bookkeeping, the step loop and the learning rate.
#include "optim/optimizer.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <set>
#include <utility>

#include "core/backend.h"
#include "core/error.h"

namespace mixprec {
namespace {

// Splits a buffer key "<buffer>.<index>"; false when it is not of that form.
bool split_buffer_key(const std::string& key, std::string& buffer, size_t& index) {
  const size_t dot = key.rfind('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == key.size()) return false;
  const char* first = key.data() + dot + 1;
  const char* last = key.data() + key.size();
  // from_chars alone would accept a prefix ("3x") and leading zeros would give two names
  // for one index.
  if (*first == '0' && last - first > 1) return false;
  const auto [end, error] = std::from_chars(first, last, index);
  if (error != std::errc() || end != last) return false;
  buffer = key.substr(0, dot);
  return true;
}

}  // namespace

Optimizer::Optimizer(std::vector<Parameter> params, std::string name)
    : params_(std::move(params)), name_(std::move(name)) {
  MIXPREC_CHECK(!params_.empty(), "optimizer '", name_, "': the parameter list is empty; pass the "
                "model's parameters");
  for (size_t i = 0; i < params_.size(); ++i) {
    MIXPREC_CHECK(params_[i].defined(), "optimizer '", name_, "': parameter ", i,
                  " is undefined (default-constructed)");
    for (size_t j = 0; j < i; ++j) {
      // Listed twice, it would be updated twice per step.
      MIXPREC_CHECK(!params_[j].is_same(params_[i]), "optimizer '", name_, "': parameter '",
                    params_[i].name(), "' is listed twice (positions ", j, " and ", i,
                    "); pass each parameter once");
    }
  }
}

void Optimizer::check_gradients(bool every_trainable_has_one) const {
  // Every check runs before the first update, so a misuse leaves all parameters untouched.
  for (const Parameter& p : params_) {
    if (!p.requires_grad()) continue;
    if (!p.grad().defined()) {
      MIXPREC_CHECK(!every_trainable_has_one, "optimizer '", name_, "': parameter '", p.name(),
                    "' has no gradient, but a gated step updates every trainable parameter "
                    "(their step counts advance together on the device); freeze it "
                    "(requires_grad false) or take regular steps (GradScaler::step)");
      continue;
    }
    const double scale = p.working().grad_scale();
    MIXPREC_CHECK(scale == 1.0, "optimizer '", name_, "': the gradient of '", p.name(),
                  "' still carries a loss scale of ", scale, "; call scaler.step(optimizer) "
                  "(or scaler.unscale(optimizer) first) instead of optimizer.step()");
    const Tensor grad = p.grad();
    const Tensor master = p.master();
    MIXPREC_CHECK(grad.dtype() == DType::F32 && grad.shape() == master.shape() &&
                      grad.device() == master.device(),
                  "optimizer '", name_, "': the gradient of '", p.name(), "' is ", describe(grad),
                  " but the optimizer needs an F32 gradient shaped like its master ",
                  describe(master));
  }
}

void Optimizer::update_by_device(const std::vector<size_t>& indices, const StepGate* gate) {
  // One call per device, in order of first appearance; normally all share one.
  std::vector<bool> done(indices.size(), false);
  for (size_t first = 0; first < indices.size(); ++first) {
    if (done[first]) continue;
    const Device device = params_[indices[first]].device();
    std::vector<size_t> group;
    for (size_t k = first; k < indices.size(); ++k) {
      if (done[k] || params_[indices[k]].device() != device) continue;
      group.push_back(indices[k]);
      done[k] = true;
    }
    update_all(group, gate);
  }
}

void Optimizer::require_settled(const char* call) const {
  MIXPREC_CHECK(!unsettled_, "optimizer '", name_, "': ", call, " while gated steps are not "
                "yet settled; resolve them first (DeferredSteps::resolve)");
}

void Optimizer::check_gate(const StepGate& gate) const {
  const int64_t rates = static_cast<int64_t>(gate.lr_by_taken.size());
  MIXPREC_CHECK(rates >= 1 && rates <= kMaxDeferredSteps, "optimizer '", name_, "': a gated "
                "step needs 1 to ", kMaxDeferredSteps, " learning rates (one per possible count "
                "of applied earlier steps), got ", rates);
  for (double lr : gate.lr_by_taken)
    MIXPREC_CHECK(std::isfinite(lr) && lr >= 0.0 && lr <= std::numeric_limits<float>::max(),
                  "optimizer '", name_, "': a gated step's learning rate must be finite, "
                  "non-negative and within FP32's range, got ", lr);
  const Device device = gate.found_inf.defined() ? gate.found_inf.device() : kCPU;
  MIXPREC_CHECK(gate.found_inf.defined() && gate.found_inf.dtype() == DType::F32 &&
                    gate.found_inf.numel() == 1,
                "optimizer '", name_, "': found_inf must be an F32 [1] tensor, got ",
                gate.found_inf.defined() ? describe(gate.found_inf) : "undefined");
  MIXPREC_CHECK(gate.taken.defined() && gate.taken.dtype() == DType::I32 &&
                    gate.taken.numel() == 1 && gate.taken.device() == device,
                "optimizer '", name_, "': the gate's count must be an I32 [1] tensor on ", device,
                " (found_inf's device), got ",
                gate.taken.defined() ? describe(gate.taken) : "undefined");
  // The flag and the count serve every update, and checking here keeps a throw from leaving
  // some parameters updated.
  for (size_t i = 0; i < params_.size(); ++i) {
    const Parameter& p = params_[i];
    MIXPREC_CHECK(!p.requires_grad() || p.device() == device, "optimizer '", name_,
                  "': parameter '", p.name(), "' is on ", p.device(), " but the gated step's "
                  "flag and count are on ", device, "; keep the trainable parameters there");
    // Settling assumes that each unsettled update updated the same parameters.
    MIXPREC_CHECK(!unsettled_ || (p.requires_grad() && owned(i)) == gated_trainable_[i],
                  "optimizer '",
                  name_, "': parameter '", p.name(), "' was ",
                  p.requires_grad() ? "unfrozen" : "frozen", " while gated steps are not yet "
                  "settled; resolve them first");
  }
  check_gradients(true);
}

void Optimizer::step(const StepGate* gate) {
  std::vector<size_t> indices;
  if (gate == nullptr) {
    require_settled("an ungated step()");
    check_gradients(false);
    for (size_t i = 0; i < params_.size(); ++i) {
      const Parameter& p = params_[i];
      if (p.requires_grad() && p.grad().defined() && owned(i)) indices.push_back(i);
    }
    update_by_device(indices, nullptr);
    ++steps_taken_;
    return;
  }
  check_gate(*gate);
  gated_trainable_.clear();
  for (size_t i = 0; i < params_.size(); ++i) {
    const bool updated = params_[i].requires_grad() && owned(i);
    gated_trainable_.push_back(updated);
    if (updated) indices.push_back(i);
  }
  update_by_device(indices, gate);
  unsettled_ = true;
}

bool Optimizer::buffers_started() const {
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].requires_grad() && owned(i) && !buffers_ready(i)) return false;
  return true;
}

void Optimizer::set_owned(std::vector<bool> owned) {
  require_settled("set_owned");
  MIXPREC_CHECK(owned.size() == params_.size(), "optimizer '", name_, "': set_owned needs one "
                "flag per parameter (", params_.size(), "), got ", owned.size());
  for (size_t i = 0; i < owned.size(); ++i)
    if (!owned[i]) release_state(i);
  owned_ = std::move(owned);
}

void Optimizer::settle(int64_t taken) {
  MIXPREC_CHECK(taken >= 0, "optimizer '", name_, "': settle(", taken, "): the count of "
                "applied steps cannot be negative");
  if (!unsettled_) {
    MIXPREC_CHECK(taken == 0, "optimizer '", name_, "': settle(", taken, ") without gated "
                  "steps to settle");
    return;
  }
  settle_state(taken);
  steps_taken_ += taken;
  unsettled_ = false;
}

void Optimizer::zero_grad(bool set_to_none) {
  for (Parameter& p : params_) p.zero_grad(set_to_none);
}

void Optimizer::set_lr(double lr) {
  // The update runs in FP32: a rate beyond its range would turn every weight into Inf/NaN.
  MIXPREC_CHECK(std::isfinite(lr) && lr >= 0.0 && lr <= std::numeric_limits<float>::max(),
                "optimizer '", name_, "': the learning rate must be finite, non-negative and "
                "within FP32's range, got ", lr);
  lr_ = lr;
}

OptimizerState Optimizer::state_dict() const {
  require_settled("state_dict()");
  OptimizerState state;
  nlohmann::json names = nlohmann::json::array();
  for (const Parameter& p : params_) names.push_back(p.name());
  state.scalars["type"] = type_name();
  state.scalars["name"] = name_;
  state.scalars["steps_taken"] = steps_taken_;
  state.scalars["lr"] = lr_;
  state.scalars["params"] = std::move(names);
  save_state(state);
  // Copies, so that later steps do not change a state that is still being written out.
  for (auto& entry : state.tensors) {
    Tensor& t = entry.second;
    t = t.device().is_cpu() ? t.clone() : t.to(kCPU);
  }
  return state;
}

void Optimizer::load_state_dict(const OptimizerState& state) {
  require_settled("load_state_dict()");
  const nlohmann::json& s = state.scalars;
  MIXPREC_CHECK(s.is_object(), "optimizer '", name_, "': the optimizer state's scalars must be "
                "a JSON object, got ", s.type_name());
  const auto type = s.find("type");
  MIXPREC_CHECK(type != s.end() && type->is_string(), "optimizer '", name_,
                "': the optimizer state has no \"type\" string");
  const std::string state_type = type->get<std::string>();
  MIXPREC_CHECK(state_type == type_name(), "optimizer '", name_, "': the optimizer state is for '",
                state_type, "', this optimizer is '", type_name(), "'");

  const auto steps = s.find("steps_taken");
  MIXPREC_CHECK(steps != s.end() && steps->is_number_integer() && steps->get<int64_t>() >= 0,
                "optimizer '", name_, "': the optimizer state needs \"steps_taken\", a "
                "non-negative integer, got ", steps == s.end() ? "nothing" : steps->dump());
  const int64_t steps_taken = steps->get<int64_t>();

  const auto lr_entry = s.find("lr");
  MIXPREC_CHECK(lr_entry != s.end() && lr_entry->is_number(), "optimizer '", name_,
                "': the optimizer state needs \"lr\", a number, got ",
                lr_entry == s.end() ? "nothing" : lr_entry->dump());
  const double lr = lr_entry->get<double>();
  MIXPREC_CHECK(std::isfinite(lr) && lr >= 0.0 && lr <= std::numeric_limits<float>::max(),
                "optimizer '", name_, "': the optimizer state's lr must be finite, non-negative "
                "and within FP32's range, got ", lr);

  const auto names = s.find("params");
  MIXPREC_CHECK(names != s.end() && names->is_array(), "optimizer '", name_,
                "': the optimizer state has no \"params\" list of parameter names");
  MIXPREC_CHECK(names->size() == params_.size(), "optimizer '", name_, "': the optimizer state "
                "holds ", names->size(), " parameters, this optimizer has ", params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const nlohmann::json& n = (*names)[i];
    MIXPREC_CHECK(n.is_string() && n.get<std::string>() == params_[i].name(), "optimizer '",
                  name_, "': parameter ", i, " is ", n.dump(), " in the optimizer state but '",
                  params_[i].name(), "' here; the state belongs to other parameters (or another "
                  "order)");
  }

  std::set<std::string> seen;
  for (const auto& [key, t] : state.tensors) {
    std::string buffer;
    size_t index = 0;
    MIXPREC_CHECK(split_buffer_key(key, buffer, index), "optimizer '", name_,
                  "': the optimizer state's tensor '", key, "' is not named <buffer>.<index>");
    MIXPREC_CHECK(index < params_.size(), "optimizer '", name_, "': the optimizer state's tensor '",
                  key, "' names parameter ", index, " but there are ", params_.size());
    MIXPREC_CHECK(seen.insert(key).second, "optimizer '", name_, "': the optimizer state lists '",
                  key, "' twice");
    const Parameter& p = params_[index];
    MIXPREC_CHECK(t.defined(), "optimizer '", name_, "': ", key, " is undefined");
    MIXPREC_CHECK(t.dtype() == DType::F32, "optimizer '", name_, "': ", key, " is ",
                  t.dtype(), " but optimizer buffers are F32");
    MIXPREC_CHECK(t.shape() == p.shape(), "optimizer '", name_, "': ", key, " has shape ",
                  shape_str(t.shape()), " but parameter '", p.name(), "' has ",
                  shape_str(p.shape()));
  }

  // load_state checks its part before writing; past it nothing can throw, so a failure
  // anywhere leaves the optimizer as it was.
  load_state(state);
  steps_taken_ = steps_taken;
  lr_ = lr;
}

const Tensor* Optimizer::find_buffer(const OptimizerState& state, const std::string& buffer,
                                     size_t index) {
  const std::string key = buffer + "." + std::to_string(index);
  for (const auto& entry : state.tensors) {
    if (entry.first == key) return &entry.second;
  }
  return nullptr;
}

void Optimizer::check_known_buffers(const OptimizerState& state,
                                    const std::vector<std::string>& known) const {
  for (const auto& entry : state.tensors) {
    const std::string buffer = entry.first.substr(0, entry.first.rfind('.'));
    bool found = false;
    for (const std::string& k : known) found = found || k == buffer;
    MIXPREC_CHECK(found, "optimizer '", name_, "': the optimizer state's tensor '", entry.first,
                  "' is not a buffer of ", type_name());
  }
}

Tensor Optimizer::restore_buffer(const Tensor& stored, size_t index) const {
  const Device device = params_.at(index).device();
  return stored.device() == device ? stored.clone() : stored.to(device);
}

}  // namespace mixprec
