// SGD: one Backend::sgd_steps call updates every parameter's master, momentum buffer and
// working copy together.
#include "optim/sgd.h"

#include <cmath>
#include <string>
#include <utility>

#include "core/backend.h"
#include "core/error.h"

namespace mixprec {
namespace {

// The primitive computes in FP32, so a value must also survive the narrowing.
void check_option(const std::string& name, const char* option, double value, bool non_negative) {
  MIXPREC_CHECK(std::isfinite(value) && std::isfinite(static_cast<float>(value)), "SGD '", name,
                "': ", option, " must be finite (and within FP32 range), got ", value);
  MIXPREC_CHECK(!non_negative || value >= 0.0, "SGD '", name, "': ", option,
                " must not be negative, got ", value);
}

}  // namespace

SGD::SGD(std::vector<Parameter> params, SgdOptions options, std::string name)
    : Optimizer(std::move(params), std::move(name)), options_(options) {
  check_option(this->name(), "lr", options_.lr, true);
  check_option(this->name(), "momentum", options_.momentum, true);
  check_option(this->name(), "dampening", options_.dampening, false);
  check_option(this->name(), "weight_decay", options_.weight_decay, true);
  MIXPREC_CHECK(!options_.nesterov || (options_.momentum > 0.0 && options_.dampening == 0.0),
                "SGD '", this->name(), "': nesterov momentum needs momentum > 0 and dampening 0, "
                "got momentum ", options_.momentum, " and dampening ", options_.dampening);
  set_initial_lr(options_.lr);
  momentum_.resize(this->params().size());
  momentum_unsettled_.assign(this->params().size(), false);
}

SgdHyper SGD::base_hyper(double lr) const {
  SgdHyper hyper;
  hyper.lr = static_cast<float>(lr);
  hyper.momentum = static_cast<float>(options_.momentum);
  hyper.dampening = static_cast<float>(options_.dampening);
  hyper.weight_decay = static_cast<float>(options_.weight_decay);
  hyper.nesterov = options_.nesterov;
  return hyper;
}

SgdRateTable SGD::rate_table(const StepGate& gate, bool unstarted) {
  SgdRateTable table;
  table.count = static_cast<int32_t>(gate.lr_by_taken.size());
  for (int32_t j = 0; j < table.count; ++j) {
    table.entry[j].lr = static_cast<float>(gate.lr_by_taken[static_cast<size_t>(j)]);
    table.entry[j].first_step = unstarted && j == 0 ? 1 : 0;
  }
  return table;
}

void SGD::update_all(const std::vector<size_t>& indices, const StepGate* gate) {
  const size_t n = indices.size();
  if (n == 0) return;
  const bool use_momentum = options_.momentum != 0.0;
  // Sized before any pointer into them is taken.
  std::vector<Tensor> masters(n), grads(n), buffers(n), workings(n);
  std::vector<SgdRateTable> tables(gate != nullptr ? n : 0);
  std::vector<bool> started_here(n, false);
  std::vector<SgdParamStep> steps(n);
  for (size_t k = 0; k < n; ++k) {
    const size_t index = indices[k];
    const Parameter& param = params()[index];
    masters[k] = param.master();
    grads[k] = param.grad();
    SgdParamStep& step = steps[k];
    step.hyper = base_hyper(lr());
    // A buffer is created on the parameter's first update and kept only once that update
    // succeeded; a failed first update must not leave an uninitialised buffer behind.
    bool unstarted = false;
    if (use_momentum) {
      buffers[k] = momentum_[index];
      // Gated: a buffer that no applied update has written yet; only the first taken
      // step (j == 0) starts it from the gradient.
      unstarted = !buffers[k].defined() || (gate != nullptr && momentum_unsettled_[index]);
      if (!buffers[k].defined()) {
        buffers[k] = Tensor::zeros(masters[k].shape(), DType::F32, masters[k].device());
        started_here[k] = true;
      }
      step.momentum = &buffers[k];
    }
    if (gate != nullptr) {
      tables[k] = rate_table(*gate, unstarted);
      step.table = &tables[k];
    } else {
      step.hyper.first_step = unstarted;
    }
    if (param.working_dtype() != DType::F32) workings[k] = param.working();
    step.master = &masters[k];
    step.grad = &grads[k];
    step.working = workings[k].defined() ? &workings[k] : nullptr;
  }
  backend_for(masters.front().device())
      .sgd_steps(steps, gate != nullptr ? &gate->taken : nullptr,
                 gate != nullptr ? &gate->found_inf : nullptr);
  for (size_t k = 0; k < n; ++k) {
    // A buffer started by a gated step is confirmed only by a settle that took a step.
    if (gate != nullptr && started_here[k]) momentum_unsettled_[indices[k]] = true;
    keep_update(indices[k], masters[k], workings[k], buffers[k]);
  }
}

void SGD::keep_update(size_t index, Tensor& master, Tensor& working, Tensor& buffer) {
  master.mark_modified();
  if (working.defined()) working.mark_modified();
  if (buffer.defined()) {
    buffer.mark_modified();
    momentum_[index] = buffer;
  }
}

bool SGD::buffers_ready(size_t index) const {
  return options_.momentum == 0.0 || (momentum_[index].defined() && !momentum_unsettled_[index]);
}

void SGD::release_state(size_t index) {
  momentum_.at(index) = Tensor();
  momentum_unsettled_.at(index) = false;
}

void SGD::settle_state(int64_t taken) {
  for (size_t i = 0; i < momentum_.size(); ++i) {
    // Buffers started by gated steps that were all skipped were never written.
    if (momentum_unsettled_[i] && taken == 0) momentum_[i] = Tensor();
    momentum_unsettled_[i] = false;
  }
}

void SGD::save_state(OptimizerState& state) const {
  for (size_t i = 0; i < momentum_.size(); ++i) {
    if (momentum_[i].defined()) state.tensors.emplace_back("momentum." + std::to_string(i),
                                                           momentum_[i]);
  }
}

void SGD::load_state(const OptimizerState& state) {
  check_known_buffers(state, {"momentum"});
  MIXPREC_CHECK(options_.momentum != 0.0 || state.tensors.empty(), "SGD '", name(),
                "': the optimizer state holds momentum buffers (", state.tensors.front().first,
                ") but this SGD has momentum 0");
  // Every copy is made before the first buffer is replaced.
  std::vector<Tensor> momentum(momentum_.size());
  for (size_t i = 0; i < momentum.size(); ++i) {
    if (const Tensor* stored = find_buffer(state, "momentum", i)) {
      momentum[i] = restore_buffer(*stored, i);
    }
  }
  momentum_.swap(momentum);
}

}  // namespace mixprec
