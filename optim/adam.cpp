// Adam and AdamW: one Backend::adam_steps call updates every parameter's master, both
// moments and working copy together.
#include "optim/adam.h"

#include <cmath>
#include <string>
#include <utility>

#include "core/backend.h"
#include "core/error.h"

namespace mixprec {
namespace {

const char* label(bool decoupled) { return decoupled ? "AdamW" : "Adam"; }

// The primitive computes in FP32, so a value must also survive the narrowing.
void check_finite(bool decoupled, const std::string& name, const char* option, double value) {
  MIXPREC_CHECK(std::isfinite(value) && std::isfinite(static_cast<float>(value)),
                label(decoupled), " '", name, "': ", option,
                " must be finite (and within FP32 range), got ", value);
}

// A beta that rounds to 1 in FP32 would make 1 - beta^t zero: the bias correction divides
// by it.
void check_beta(bool decoupled, const std::string& name, const char* option, double value) {
  check_finite(decoupled, name, option, value);
  MIXPREC_CHECK(value >= 0.0 && value < 1.0 && static_cast<float>(value) < 1.0f,
                label(decoupled), " '", name, "': ", option,
                " must be in [0, 1) (also once rounded to FP32), got ", value);
}

}  // namespace

bool decay_matrices_only(const Parameter& param) { return param.shape().size() >= 2; }

Adam::Adam(std::vector<Parameter> params, AdamOptions options, std::string name)
    : Adam(std::move(params), std::move(options), std::move(name), false) {}

Adam::Adam(std::vector<Parameter> params, AdamOptions options, std::string name, bool decoupled)
    : Optimizer(std::move(params), std::move(name)),
      options_(std::move(options)),
      decoupled_(decoupled) {
  check_finite(decoupled_, this->name(), "lr", options_.lr);
  MIXPREC_CHECK(options_.lr >= 0.0, label(decoupled_), " '", this->name(),
                "': lr must not be negative, got ", options_.lr);
  check_beta(decoupled_, this->name(), "beta1", options_.beta1);
  check_beta(decoupled_, this->name(), "beta2", options_.beta2);
  check_finite(decoupled_, this->name(), "eps", options_.eps);
  // eps keeps the denominator away from zero; one that vanishes in FP32 would not.
  MIXPREC_CHECK(options_.eps > 0.0 && static_cast<float>(options_.eps) > 0.0f, label(decoupled_),
                " '", this->name(), "': eps must be positive (also once rounded to FP32), got ",
                options_.eps);
  check_finite(decoupled_, this->name(), "weight_decay", options_.weight_decay);
  MIXPREC_CHECK(options_.weight_decay >= 0.0, label(decoupled_), " '", this->name(),
                "': weight_decay must not be negative, got ", options_.weight_decay);
  set_initial_lr(options_.lr);

  const size_t n = this->params().size();
  decays_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const Parameter& p = this->params()[i];
    if (options_.decay_filter) decays_[i] = options_.decay_filter(p);
    else decays_[i] = decoupled_ ? decay_matrices_only(p) : true;
  }
  exp_avg_.resize(n);
  exp_avg_sq_.resize(n);
  param_steps_.assign(n, 0);
}

AdamW::AdamW(std::vector<Parameter> params, AdamOptions options, std::string name)
    : Adam(std::move(params), std::move(options), std::move(name), true) {}

AdamHyper Adam::base_hyper(size_t index, double lr) const {
  AdamHyper hyper;
  hyper.lr = static_cast<float>(lr);
  hyper.beta1 = static_cast<float>(options_.beta1);
  hyper.beta2 = static_cast<float>(options_.beta2);
  hyper.eps = static_cast<float>(options_.eps);
  hyper.weight_decay = decays_[index] ? static_cast<float>(options_.weight_decay) : 0.0f;
  hyper.decoupled_weight_decay = decoupled_;
  return hyper;
}

void Adam::start_moments(size_t index, const Tensor& master, Tensor& exp_avg,
                         Tensor& exp_avg_sq) const {
  // The moments are created on the parameter's first update and kept only once that update
  // succeeded, like SGD's momentum buffer.
  exp_avg = exp_avg_[index];
  exp_avg_sq = exp_avg_sq_[index];
  if (!exp_avg.defined()) exp_avg = Tensor::zeros(master.shape(), DType::F32, master.device());
  if (!exp_avg_sq.defined()) {
    exp_avg_sq = Tensor::zeros(master.shape(), DType::F32, master.device());
  }
}

void Adam::keep_update(size_t index, Tensor& master, Tensor& working, Tensor& exp_avg,
                       Tensor& exp_avg_sq) {
  master.mark_modified();
  if (working.defined()) working.mark_modified();
  exp_avg.mark_modified();
  exp_avg_sq.mark_modified();
  exp_avg_[index] = exp_avg;
  exp_avg_sq_[index] = exp_avg_sq;
}

AdamRateTable Adam::rate_table(size_t index, const StepGate& gate) const {
  // Entry j: the update that follows j taken pending steps, so the parameter's (j+1)-th
  // update since the last settle, at the rate the schedule gives after them.
  AdamRateTable table;
  table.count = static_cast<int32_t>(gate.lr_by_taken.size());
  for (int32_t j = 0; j < table.count; ++j) {
    AdamHyper hyper = base_hyper(index, gate.lr_by_taken[static_cast<size_t>(j)]);
    hyper.set_step(param_steps_[index] + j + 1);
    table.entry[j] = rates_of(hyper);
  }
  return table;
}

void Adam::update_all(const std::vector<size_t>& indices, const StepGate* gate) {
  const size_t n = indices.size();
  if (n == 0) return;
  // Sized before any pointer into them is taken.
  std::vector<Tensor> masters(n), grads(n), exp_avgs(n), exp_avg_sqs(n), workings(n);
  // Parameters with the same decay and update count share one table (usually two tables for
  // a whole model), so each is computed, and checked, once. Reserved so that pointers into it
  // stay valid.
  std::vector<AdamRateTable> tables;
  std::vector<size_t> table_owner;  // the index whose decay and count each table is for
  if (gate != nullptr) {
    tables.reserve(n);
    table_owner.reserve(n);
  }
  std::vector<AdamParamStep> steps(n);
  for (size_t k = 0; k < n; ++k) {
    const size_t index = indices[k];
    const Parameter& param = params()[index];
    masters[k] = param.master();
    grads[k] = param.grad();
    start_moments(index, masters[k], exp_avgs[k], exp_avg_sqs[k]);
    if (param.working_dtype() != DType::F32) workings[k] = param.working();
    AdamParamStep& step = steps[k];
    step.hyper = base_hyper(index, lr());
    if (gate != nullptr) {
      size_t t = 0;
      while (t < tables.size() && (decays_[table_owner[t]] != decays_[index] ||
                                   param_steps_[table_owner[t]] != param_steps_[index])) {
        ++t;
      }
      if (t == tables.size()) {
        tables.push_back(rate_table(index, *gate));
        table_owner.push_back(index);
      }
      step.table = &tables[t];
    } else {
      // set_step reads lr, the betas and weight_decay, so it comes last.
      step.hyper.set_step(param_steps_[index] + 1);
    }
    step.master = &masters[k];
    step.grad = &grads[k];
    step.exp_avg = &exp_avgs[k];
    step.exp_avg_sq = &exp_avg_sqs[k];
    step.working = workings[k].defined() ? &workings[k] : nullptr;
  }
  backend_for(masters.front().device())
      .adam_steps(steps, gate != nullptr ? &gate->taken : nullptr,
                  gate != nullptr ? &gate->found_inf : nullptr);
  for (size_t k = 0; k < n; ++k) {
    keep_update(indices[k], masters[k], workings[k], exp_avgs[k], exp_avg_sqs[k]);
    // A gated update counts once settled.
    if (gate == nullptr) ++param_steps_[indices[k]];
  }
}

bool Adam::buffers_ready(size_t index) const {
  return exp_avg_[index].defined() && exp_avg_sq_[index].defined();
}

void Adam::release_state(size_t index) {
  exp_avg_.at(index) = Tensor();
  exp_avg_sq_.at(index) = Tensor();
}

void Adam::settle_state(int64_t taken) {
  // Gated steps update every trainable parameter, so each advanced by `taken`.
  for (size_t i = 0; i < param_steps_.size(); ++i) {
    if (!gated(i)) continue;
    param_steps_[i] += taken;
    // Moments started by steps that were all skipped hold zeros nobody wrote to: a parameter
    // that has never been updated has none.
    if (param_steps_[i] == 0) {
      exp_avg_[i] = Tensor();
      exp_avg_sq_[i] = Tensor();
    }
  }
}

void Adam::save_state(OptimizerState& state) const {
  state.scalars["param_steps"] = param_steps_;
  for (size_t i = 0; i < param_steps_.size(); ++i) {
    if (exp_avg_[i].defined()) {
      state.tensors.emplace_back("exp_avg." + std::to_string(i), exp_avg_[i]);
    }
    if (exp_avg_sq_[i].defined()) {
      state.tensors.emplace_back("exp_avg_sq." + std::to_string(i), exp_avg_sq_[i]);
    }
  }
}

void Adam::load_state(const OptimizerState& state) {
  check_known_buffers(state, {"exp_avg", "exp_avg_sq"});
  const size_t n = params().size();
  const auto entry = state.scalars.find("param_steps");
  MIXPREC_CHECK(entry != state.scalars.end() && entry->is_array() && entry->size() == n,
                label(decoupled_), " '", name(), "': the optimizer state needs \"param_steps\", "
                "a list of ", n, " step counts, got ",
                entry == state.scalars.end() ? "nothing" : entry->dump());
  // load_state_dict has checked it already.
  const int64_t steps_taken = state.scalars.at("steps_taken").get<int64_t>();

  std::vector<int64_t> param_steps(n, 0);
  std::vector<Tensor> exp_avg(n), exp_avg_sq(n);
  for (size_t i = 0; i < n; ++i) {
    const nlohmann::json& count = (*entry)[i];
    MIXPREC_CHECK(count.is_number_integer() && count.get<int64_t>() >= 0 &&
                      count.get<int64_t>() <= steps_taken,
                  label(decoupled_), " '", name(), "': param_steps[", i, "] must be an integer "
                  "in [0, steps_taken = ", steps_taken, "], got ", count.dump());
    param_steps[i] = count.get<int64_t>();
    const Tensor* m = find_buffer(state, "exp_avg", i);
    const Tensor* v = find_buffer(state, "exp_avg_sq", i);
    // A parameter that has been updated has both moments; one that has not has neither
    // (its first update starts them from zero).
    const bool started = param_steps[i] > 0;
    for (const auto& [buffer, stored] : {std::pair{"exp_avg", m}, std::pair{"exp_avg_sq", v}}) {
      MIXPREC_CHECK(started == (stored != nullptr), label(decoupled_), " '", name(), "': ",
                    started ? "the optimizer state lacks " : "the optimizer state holds ", buffer,
                    ".", i, " but param_steps[", i, "] is ", param_steps[i], " (parameter '",
                    params()[i].name(), "')");
    }
    if (started) {
      exp_avg[i] = restore_buffer(*m, i);
      exp_avg_sq[i] = restore_buffer(*v, i);
    }
  }
  param_steps_.swap(param_steps);
  exp_avg_.swap(exp_avg);
  exp_avg_sq_.swap(exp_avg_sq);
}

}  // namespace mixprec
