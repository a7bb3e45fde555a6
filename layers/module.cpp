// Module: registration, the torch-ordered walks over parameters, buffers and children, and
// state-dict loading.
//
// Every walk goes through the three collectors, which list a module's own entries first and
// then each child's, depth first, with dotted names; that single order is what makes
// state_dict() line up with torch's. Tied weights are one Parameter registered under two
// names: the collectors keep both (state_dict() lists both, as torch does), and
// named_parameters() drops the later ones so that an optimizer updates the value once.
#include "layers/module.h"

#include <sstream>
#include <utility>

#include "core/autograd/grad_mode.h"
#include "core/error.h"

namespace mixprec {
namespace {

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// Local names are single path components: a dot would make two different trees produce the
// same dotted name.
void check_local_name(const char* what, const std::string& name) {
  MIXPREC_CHECK(!name.empty(), "Module: a ", what, " name must not be empty");
  MIXPREC_CHECK(name.find('.') == std::string::npos, "Module: the ", what, " name '", name,
                "' must not contain '.' (dots separate the levels of a dotted name)");
}

}  // namespace

Tensor Module::operator()(const Tensor& input) {
  // The ops this call records carry the module's path (Node::layer, anomaly reports), also
  // when a parent calls a grandchild directly, as GPT::forward calls its blocks.
  const LayerScope layer(path_, false);
  Tensor output = forward(input);
  return forward_hook_ ? forward_hook_(output) : output;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

// ---- registration ----------------------------------------------------------------------------

namespace {

template <class Entries>
bool has_name(const Entries& entries, const std::string& name) {
  for (const auto& entry : entries)
    if (entry.first == name) return true;
  return false;
}

}  // namespace

Parameter Module::register_parameter(const std::string& name, const Tensor& value) {
  check_local_name("parameter", name);
  MIXPREC_CHECK(
      !has_name(parameters_, name) && !has_name(buffers_, name) && !has_name(children_, name),
      "Module::register_parameter: '", name, "' is already registered in ", describe());
  Parameter param(name, value);
  parameters_.emplace_back(name, param);
  return param;
}

void Module::register_shared_parameter(const std::string& name, const Parameter& param) {
  check_local_name("parameter", name);
  MIXPREC_CHECK(param.defined(), "Module::register_shared_parameter: '", name,
                "' is given an undefined parameter");
  MIXPREC_CHECK(
      !has_name(parameters_, name) && !has_name(buffers_, name) && !has_name(children_, name),
      "Module::register_shared_parameter: '", name, "' is already registered in ", describe());
  parameters_.emplace_back(name, param);
}

Tensor& Module::register_buffer(const std::string& name, const Tensor& value) {
  check_local_name("buffer", name);
  MIXPREC_CHECK(value.defined(), "Module::register_buffer: '", name, "' is an undefined tensor");
  MIXPREC_CHECK(
      !has_name(parameters_, name) && !has_name(buffers_, name) && !has_name(children_, name),
      "Module::register_buffer: '", name, "' is already registered in ", describe());
  buffers_.emplace_back(name, std::make_unique<Tensor>(value.detach()));
  return *buffers_.back().second;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> child) {
  check_local_name("child module", name);
  MIXPREC_CHECK(child != nullptr, "Module::register_module: '", name, "' is a null module");
  MIXPREC_CHECK(child.get() != this, "Module::register_module: '", name,
                "' would make the module its own child");
  MIXPREC_CHECK(
      !has_name(parameters_, name) && !has_name(buffers_, name) && !has_name(children_, name),
      "Module::register_module: '", name, "' is already registered in ", describe());
  children_.emplace_back(name, std::move(child));
}

// ---- walks -------------------------------------------------------------------------------------

void Module::collect_parameters(const std::string& prefix,
                                std::vector<std::pair<std::string, Parameter>>& out) const {
  for (const auto& [name, param] : parameters_) out.emplace_back(join(prefix, name), param);
  for (const auto& [name, child] : children_) child->collect_parameters(join(prefix, name), out);
}

void Module::collect_buffers(const std::string& prefix,
                             std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const auto& [name, buffer] : buffers_) out.emplace_back(join(prefix, name), *buffer);
  for (const auto& [name, child] : children_) child->collect_buffers(join(prefix, name), out);
}

void Module::collect_state(const std::string& prefix,
                           std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const auto& [name, param] : parameters_)
    out.emplace_back(join(prefix, name), param.master());
  for (const auto& [name, buffer] : buffers_) out.emplace_back(join(prefix, name), *buffer);
  for (const auto& [name, child] : children_) child->collect_state(join(prefix, name), out);
}

namespace {

// Keeps the first name of every parameter (torch's named_parameters(remove_duplicate=True)).
std::vector<std::pair<std::string, Parameter>> first_names(
    std::vector<std::pair<std::string, Parameter>> all) {
  std::vector<std::pair<std::string, Parameter>> out;
  out.reserve(all.size());
  for (auto& entry : all) {
    bool seen = false;
    for (const auto& kept : out) seen = seen || kept.second.is_same(entry.second);
    if (!seen) out.push_back(std::move(entry));
  }
  return out;
}

}  // namespace

std::vector<std::pair<std::string, Parameter>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Parameter>> all;
  collect_parameters("", all);
  return first_names(std::move(all));
}

std::vector<Parameter> Module::parameters() const {
  std::vector<Parameter> out;
  for (auto& [name, param] : named_parameters()) out.push_back(param);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect_buffers("", out);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const {
  return children_;
}

int64_t Module::parameter_count() const {
  int64_t count = 0;
  for (const Parameter& p : parameters()) count += p.numel();
  return count;
}

std::vector<std::pair<std::string, Tensor>> Module::state_dict() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect_state("", out);
  return out;
}

void Module::assign_names(const std::string& prefix) {
  std::vector<std::pair<std::string, Parameter>> all;
  collect_parameters(prefix, all);
  for (auto& [name, param] : first_names(std::move(all))) param.set_name(name);
  std::vector<std::pair<std::string, Tensor>> buffers;
  collect_buffers(prefix, buffers);
  for (auto& [name, buffer] : buffers) buffer.set_name(name);
  assign_paths(prefix);
}

void Module::assign_paths(const std::string& path) {
  path_ = path;
  for (auto& [name, child] : children_) child->assign_paths(join(path, name));
}

// ---- loading -----------------------------------------------------------------------------------

void Module::load_state_dict(const std::map<std::string, Tensor>& state, bool strict) {
  const std::vector<std::pair<std::string, Tensor>> own = state_dict();

  // Every problem is found before anything is written, so a failed load leaves the module as
  // it was (a half-loaded model would train on a mix of two checkpoints without a word).
  std::vector<std::string> missing, unexpected, mismatched;
  std::vector<std::pair<Tensor, Tensor>> writes;  // (destination, value)
  for (const auto& [name, dest] : own) {
    const auto it = state.find(name);
    if (it == state.end()) {
      missing.push_back(name);
      continue;
    }
    const Tensor& value = it->second;
    if (!value.defined()) {
      mismatched.push_back(name + ": the value is an undefined tensor");
      continue;
    }
    if (value.shape() != dest.shape()) {
      mismatched.push_back(name + ": expected " + shape_str(dest.shape()) + " got " +
                           shape_str(value.shape()));
      continue;
    }
    if (is_floating(dest.dtype()) != is_floating(value.dtype())) {
      mismatched.push_back(name + ": expected " +
                           (is_floating(dest.dtype()) ? std::string("a floating value")
                                                      : std::string("an I32 value")) +
                           ", got " + mixprec::describe(value));
      continue;
    }
    writes.emplace_back(dest, value);
  }
  for (const auto& [name, value] : state)
    if (!has_name(own, name)) unexpected.push_back(name);

  const bool fail = !mismatched.empty() || (strict && (!missing.empty() || !unexpected.empty()));
  if (fail) {
    std::ostringstream msg;
    msg << "load_state_dict(" << (strict ? "strict" : "non-strict") << ") into " << describe()
        << ": nothing was loaded";
    auto list = [&msg](const char* what, const std::vector<std::string>& names) {
      if (names.empty()) return;
      msg << "\n  " << what << " (" << names.size() << "):";
      for (const std::string& n : names) msg << "\n    " << n;
    };
    if (strict) {
      list("missing keys", missing);
      list("unexpected keys", unexpected);
    }
    list("mismatched values", mismatched);
    MIXPREC_FAIL(msg.str());
  }

  for (auto& [dest, value] : writes) dest.copy_(value);
  // The working copies follow their masters; a master that was not written keeps its copy.
  for (Parameter param : parameters())
    for (const auto& write : writes)
      if (write.first.is_same(param.master())) {
        param.refresh_working();
        break;
      }
}

}  // namespace mixprec
