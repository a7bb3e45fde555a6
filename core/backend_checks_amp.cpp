// Argument checks of the mixed-precision primitives (core/backend.h), shared by every backend.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "core/backend_checks.h"
#include "core/error.h"
#include "core/tensor.h"

namespace mixprec::backend_checks {
namespace {

// `t` is an F32 flag tensor of one element: the shared found_inf of the amp primitives.
void found_inf_flag(const char* op, const Tensor& t, Device device) {
  MIXPREC_CHECK(t.defined(), op, ": found_inf is undefined; pass an F32 [1] tensor");
  on_device(op, "found_inf", t, device);
  MIXPREC_CHECK(t.dtype() == DType::F32 && t.numel() == 1, op, ": found_inf must be F32 [1], got ",
                describe(t));
}

// The I32 [kDynamicScaleStateWords] tensor holding a DynamicScaleState's bytes. Its values
// are not checked: on a device that would cost a read-back.
void scale_state(const char* op, const char* what, const Tensor& t, Device device) {
  MIXPREC_CHECK(t.defined(), op, ": ", what, " is undefined; pass an I32 [",
                kDynamicScaleStateWords, "] tensor holding a DynamicScaleState");
  on_device(op, what, t, device);
  MIXPREC_CHECK(t.dtype() == DType::I32 && t.shape() == Shape{kDynamicScaleStateWords}, op, ": ",
                what, " must be I32 [", kDynamicScaleStateWords,
                "] (the bytes of a DynamicScaleState), got ", describe(t));
}

// The device counter of the deferred steps: I32 [1].
void taken_counter(const char* op, const Tensor& t, Device device) {
  MIXPREC_CHECK(t.defined(), op, ": taken is undefined; pass an I32 [1] tensor");
  on_device(op, "taken", t, device);
  MIXPREC_CHECK(t.dtype() == DType::I32 && t.numel() == 1, op, ": taken must be I32 [1], got ",
                describe(t));
}

// The flags and gradients of an unscale pass.
void unscale_operands(const char* op, Device device, const std::vector<Tensor>& grads,
                      const Tensor& found_inf, const Tensor& tensor_flags) {
  found_inf_flag(op, found_inf, device);
  MIXPREC_CHECK(tensor_flags.defined(), op, ": tensor_flags is undefined; pass an I32 [",
                grads.size(), "] tensor");
  on_device(op, "tensor_flags", tensor_flags, device);
  MIXPREC_CHECK(tensor_flags.dtype() == DType::I32 &&
                    tensor_flags.shape() == Shape{static_cast<int64_t>(grads.size())},
                op, ": tensor_flags must be I32 [", grads.size(),
                "] (one flag per gradient), got ", describe(tensor_flags));
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    MIXPREC_CHECK(g.defined(), op, ": gradient ", i, " is undefined; pass only defined gradients");
    on_device(op, "gradient", g, device);
    MIXPREC_CHECK(is_floating(g.dtype()), op, ": gradient ", i, " is ", describe(g),
                  "; gradients must be F32, F16 or BF16");
  }
}

}  // namespace

// ---- mixed precision --------------------------------------------------------------------

void unscale_and_check(Device device, const std::vector<Tensor>& grads, double inv_scale,
                       const Tensor& found_inf, const Tensor& tensor_flags) {
  constexpr const char* kOp = "unscale_and_check";
  MIXPREC_CHECK(std::isfinite(inv_scale) && inv_scale > 0, kOp,
                ": inv_scale must be finite and positive, got ", inv_scale);
  unscale_operands(kOp, device, grads, found_inf, tensor_flags);
}

void squared_norms(Device device, const std::vector<Tensor>& xs, const Tensor& out) {
  constexpr const char* kOp = "squared_norms";
  MIXPREC_CHECK(out.defined(), kOp, ": out is undefined; pass an F32 [", xs.size(), "] tensor");
  on_device(kOp, "out", out, device);
  MIXPREC_CHECK(out.dtype() == DType::F32 && out.shape() == Shape{static_cast<int64_t>(xs.size())},
                kOp, ": out must be F32 [", xs.size(), "] (one value per tensor), got ",
                describe(out));
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    MIXPREC_CHECK(x.defined(), kOp, ": tensor ", i, " is undefined");
    on_device(kOp, "tensor", x, device);
    MIXPREC_CHECK(is_floating(x.dtype()), kOp, ": tensor ", i, " is ", describe(x),
                  "; only F32, F16 and BF16 tensors are supported");
  }
}

namespace {

// The F32 master and its F32 true-scale gradient of the same shape.
void master_and_grad(const char* op, Device device, const Tensor& master, const Tensor& grad) {
  MIXPREC_CHECK(master.defined() && grad.defined(), op, ": master and grad must be defined");
  on_device(op, "master", master, device);
  on_device(op, "grad", grad, device);
  MIXPREC_CHECK(master.dtype() == DType::F32, op, ": the master must be F32, got ",
                describe(master));
  MIXPREC_CHECK(grad.dtype() == DType::F32 && grad.shape() == master.shape(), op,
                ": the gradient ", describe(grad), " must be F32 with the master's shape ",
                describe(master));
}

// An optimizer state buffer: F32 with the master's shape.
void state_buffer(const char* op, const char* what, Device device, const Tensor& buffer,
                  const Tensor& master) {
  MIXPREC_CHECK(buffer.defined(), op, ": the ", what, " is undefined");
  on_device(op, what, buffer, device);
  MIXPREC_CHECK(buffer.dtype() == DType::F32 && buffer.shape() == master.shape(), op, ": the ",
                what, " ", describe(buffer), " must be F32 with the master's shape ",
                describe(master));
}

// `working` may be F16 or BF16 (the usual case), or F32 when it is a tensor distinct from the
// master (a plain copy, e.g. a replica). A working copy that shares the master's storage is
// rejected: under an F32 policy the master is its own working copy, and the caller passes
// null.
void working_copy(const char* op, Device device, const Tensor* working, const Tensor& master) {
  if (working == nullptr) return;
  MIXPREC_CHECK(working->defined(), op, ": the working copy is undefined; pass null for none");
  on_device(op, "working copy", *working, device);
  MIXPREC_CHECK(is_floating(working->dtype()) && working->shape() == master.shape(), op,
                ": the working copy ", describe(*working), " must be F16, BF16 or F32 with the "
                "master's shape ", describe(master));
  MIXPREC_CHECK(working->data() != master.data() || master.numel() == 0, op,
                ": the working copy shares the master's storage; pass null when the master is "
                "its own working copy");
}

}  // namespace

namespace {

// Names a rate-table entry in a message; nothing for an immediate step's own hyper.
struct EntryName {
  int32_t index = -1;
};

std::ostream& operator<<(std::ostream& out, EntryName entry) {
  if (entry.index >= 0) out << " (table entry " << entry.index << ")";
  return out;
}

void sgd_operands(const char* op, Device device, const SgdHyper& hyper, const Tensor& master,
                  const Tensor& grad, const Tensor* momentum, const Tensor* working,
                  const Tensor* found_inf) {
  master_and_grad(op, device, master, grad);
  MIXPREC_CHECK(hyper.momentum == 0.0f || momentum != nullptr, op, ": momentum ",
                hyper.momentum, " needs a momentum buffer (F32, ", describe(master),
                "); pass one");
  if (momentum != nullptr) state_buffer(op, "momentum buffer", device, *momentum, master);
  working_copy(op, device, working, master);
  if (found_inf != nullptr) found_inf_flag(op, *found_inf, device);
}

// The hyperparameters as torch.optim.Adam checks them, and the derived fields against what
// set_step() computes from them.
void adam_hyper(const char* op, EntryName entry, const AdamHyper& hyper) {
  MIXPREC_CHECK(std::isfinite(hyper.lr) && hyper.lr >= 0.0f, op, entry,
                ": lr must be finite and >= 0, got ", hyper.lr);
  MIXPREC_CHECK(hyper.beta1 >= 0.0f && hyper.beta1 < 1.0f && hyper.beta2 >= 0.0f &&
                    hyper.beta2 < 1.0f,
                op, entry, ": betas must be in [0, 1), got (", hyper.beta1, ", ", hyper.beta2,
                ")");
  MIXPREC_CHECK(std::isfinite(hyper.eps) && hyper.eps >= 0.0f, op, entry,
                ": eps must be finite and >= 0, got ", hyper.eps);
  MIXPREC_CHECK(std::isfinite(hyper.weight_decay) && hyper.weight_decay >= 0.0f, op, entry,
                ": weight_decay must be finite and >= 0, got ", hyper.weight_decay);
  MIXPREC_CHECK(hyper.step >= 1, op, entry, ": step must be >= 1 (the 1-based index of this "
                "update), got ", hyper.step, "; call set_step(t) before the update");
  AdamHyper derived = hyper;
  derived.set_step(hyper.step);
  MIXPREC_CHECK(derived.step_size == hyper.step_size &&
                    derived.bias_correction2_sqrt == hyper.bias_correction2_sqrt &&
                    derived.decay_factor == hyper.decay_factor,
                op, entry, ": the bias corrections do not match step ", hyper.step, " and the "
                "hyperparameters (changed after set_step?); call set_step(t) after setting them");
}

void adam_operands(const char* op, Device device, const Tensor& master, const Tensor& grad,
                   const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor* working,
                   const Tensor* found_inf) {
  master_and_grad(op, device, master, grad);
  state_buffer(op, "exp_avg", device, exp_avg, master);
  state_buffer(op, "exp_avg_sq", device, exp_avg_sq, master);
  MIXPREC_CHECK(exp_avg.data() != exp_avg_sq.data() || master.numel() == 0, op,
                ": exp_avg and exp_avg_sq share storage; pass two distinct buffers");
  working_copy(op, device, working, master);
  if (found_inf != nullptr) found_inf_flag(op, *found_inf, device);
}

// 1 <= count <= kMaxDeferredSteps.
void table_count(const char* op, int32_t count) {
  MIXPREC_CHECK(count >= 1 && count <= kMaxDeferredSteps, op, ": the rate table's count must be "
                "in [1, ", kMaxDeferredSteps, "] (one entry per step that may be taken before "
                "the host resolves them), got ", count);
}

// ---- memory shared between the buffers of an update ------------------------------------------

// Who names a range of bytes: step i of a call, or the call's found_inf flag or taken counter.
constexpr size_t kFoundInfOwner = std::numeric_limits<size_t>::max();
constexpr size_t kTakenOwner = kFoundInfOwner - 1;

struct OwnedRange {
  uintptr_t begin, end;
  size_t owner;
};

std::string owner_name(size_t owner) {
  if (owner == kFoundInfOwner) return "found_inf";
  if (owner == kTakenOwner) return "taken";
  return "step " + std::to_string(owner);
}

// Appends t's bytes at `out` when it names any; returns the next free slot.
OwnedRange* add_range(OwnedRange* out, const Tensor* t, size_t owner) {
  if (t == nullptr || !t->defined() || t->numel() == 0) return out;
  const auto begin = reinterpret_cast<uintptr_t>(t->data());
  *out = {begin, begin + t->nbytes(), owner};
  return out + 1;
}

// The flag and counter of a call, when given.
OwnedRange* add_call_ranges(OwnedRange* out, const Tensor* found_inf, const Tensor* taken) {
  return add_range(add_range(out, found_inf, kFoundInfOwner), taken, kTakenOwner);
}

// Throws when any two ranges overlap. An update reads and writes all of them at once (one
// launch over every step on a GPU, with each value loaded once; restrict-qualified loops on
// the CPU), so a buffer that is also another buffer of the same step or of another, or the
// flag or counter every thread reads, would make the result depend on the order of loads and
// stores, and differ between backends. Valid calls never overlap: a master that is its own
// working copy is passed as null, and a momentum buffer is named only when it is used. One
// sweep in address order, remembering the range that reaches furthest: a range that starts
// before it ends overlaps it.
void no_memory_shared(const char* op, OwnedRange* first_range, OwnedRange* last_range) {
  std::sort(first_range, last_range,
            [](const OwnedRange& a, const OwnedRange& b) { return a.begin < b.begin; });
  const OwnedRange* furthest = nullptr;
  for (const OwnedRange* it = first_range; it != last_range; ++it) {
    const OwnedRange& r = *it;
    if (furthest != nullptr && r.begin < furthest->end) {
      MIXPREC_CHECK(furthest->owner != r.owner, op, ": ", owner_name(r.owner),
                    " names the same memory twice; its master, gradient, state buffers and "
                    "working copy must be distinct");
      const size_t first = std::min(furthest->owner, r.owner);
      const size_t second = std::max(furthest->owner, r.owner);
      MIXPREC_CHECK(second >= kTakenOwner, op, ": steps ", first, " and ", second,
                    " share memory (a master, gradient, state buffer or working copy); list "
                    "each parameter once, with its own buffers");
      MIXPREC_FAIL(op, ": ", owner_name(second), " shares memory with ",
                   owner_name(first), "; pass a flag and a counter of their own");
    }
    if (furthest == nullptr || r.end > furthest->end) furthest = &r;
  }
}

// The momentum buffer an SGD update uses: none when momentum is 0.
const Tensor* used_momentum(const SgdHyper& hyper, const Tensor* momentum) {
  return hyper.momentum != 0.0f ? momentum : nullptr;
}

// What the deferred SGD step checks besides memory. An entry changes only lr and first_step,
// which sgd_step does not constrain: the checks of base (the momentum buffer) hold for every
// entry.
void sgd_deferred_operands(const char* op, Device device, const SgdHyper& base,
                           const SgdRateTable& table, const Tensor& taken, const Tensor& master,
                           const Tensor& grad, const Tensor* momentum, const Tensor* working,
                           const Tensor& found_inf) {
  table_count(op, table.count);
  sgd_operands(op, device, sgd_hyper_with(base, table.entry[0]), master, grad, momentum, working,
               &found_inf);
  taken_counter(op, taken, device);
}

// Every entry of a deferred Adam table with base's other hyperparameters, as the kernel will
// use it.
void adam_table(const char* op, const AdamHyper& base, const AdamRateTable& table) {
  table_count(op, table.count);
  for (int32_t j = 0; j < table.count; ++j)
    adam_hyper(op, EntryName{j}, adam_hyper_with(base, table.entry[j]));
}

// What the deferred Adam step checks besides the table and memory.
void adam_deferred_operands(const char* op, Device device, const Tensor& taken,
                            const Tensor& master, const Tensor& grad, const Tensor& exp_avg,
                            const Tensor& exp_avg_sq, const Tensor* working,
                            const Tensor& found_inf) {
  adam_operands(op, device, master, grad, exp_avg, exp_avg_sq, working, &found_inf);
  taken_counter(op, taken, device);
}

}  // namespace

void update_loss_scale(Device device, const DynamicScaleRule& rule, const Tensor& state,
                       const Tensor& found_inf) {
  constexpr const char* kOp = "update_loss_scale";
  MIXPREC_CHECK(std::isfinite(rule.growth_factor) && rule.growth_factor > 1.0, kOp,
                ": growth_factor must be finite and > 1, got ", rule.growth_factor);
  MIXPREC_CHECK(rule.backoff_factor > 0.0 && rule.backoff_factor < 1.0, kOp,
                ": backoff_factor must be > 0 and < 1, got ", rule.backoff_factor);
  MIXPREC_CHECK(rule.growth_interval >= 1 && rule.hysteresis >= 1, kOp,
                ": growth_interval and hysteresis must be >= 1, got ", rule.growth_interval,
                " and ", rule.hysteresis);
  MIXPREC_CHECK(rule.hysteresis_mode == HysteresisMode::ResetOnGrowth ||
                    rule.hysteresis_mode == HysteresisMode::Consecutive,
                kOp, ": hysteresis_mode has the invalid value ",
                static_cast<int>(rule.hysteresis_mode));
  MIXPREC_CHECK(std::isfinite(rule.max_scale) && rule.min_scale > 0.0 &&
                    rule.min_scale <= rule.max_scale,
                kOp, ": need 0 < min_scale <= max_scale, both finite, got min_scale ",
                rule.min_scale, " and max_scale ", rule.max_scale);
  scale_state(kOp, "state", state, device);
  found_inf_flag(kOp, found_inf, device);
}

// ---- deferred steps ---------------------------------------------------------------------

void loss_scale_factor(Device device, const Tensor& scale_state_tensor, double weight,
                       const Tensor& out) {
  constexpr const char* kOp = "loss_scale_factor";
  MIXPREC_CHECK(std::isfinite(weight) && weight > 0.0, kOp,
                ": weight must be finite and positive, got ", weight);
  scale_state(kOp, "scale_state", scale_state_tensor, device);
  MIXPREC_CHECK(out.defined(), kOp, ": out is undefined; pass an F32 [1] tensor");
  on_device(kOp, "out", out, device);
  MIXPREC_CHECK(out.dtype() == DType::F32 && out.numel() == 1, kOp, ": out must be F32 [1], got ",
                describe(out));
}

void unscale_and_check_on_device(Device device, const std::vector<Tensor>& grads,
                                 const Tensor& scale_state_tensor, const Tensor& found_inf,
                                 const Tensor& tensor_flags) {
  constexpr const char* kOp = "unscale_and_check_on_device";
  scale_state(kOp, "scale_state", scale_state_tensor, device);
  unscale_operands(kOp, device, grads, found_inf, tensor_flags);
}

void clip_by_total_norm(Device device, const std::vector<Tensor>& grads,
                        const Tensor& squared_sums, double max_norm, const Tensor& norm_out) {
  constexpr const char* kOp = "clip_by_total_norm";
  MIXPREC_CHECK(std::isfinite(max_norm) && max_norm > 0.0, kOp,
                ": max_norm must be finite and positive, got ", max_norm);
  MIXPREC_CHECK(squared_sums.defined(), kOp, ": squared_sums is undefined; pass an F32 [",
                grads.size(), "] tensor from squared_norms");
  on_device(kOp, "squared_sums", squared_sums, device);
  MIXPREC_CHECK(squared_sums.dtype() == DType::F32 &&
                    squared_sums.shape() == Shape{static_cast<int64_t>(grads.size())},
                kOp, ": squared_sums must be F32 [", grads.size(),
                "] (one sum of squares per gradient), got ", describe(squared_sums));
  MIXPREC_CHECK(norm_out.defined(), kOp, ": norm_out is undefined; pass an F32 [1] tensor");
  on_device(kOp, "norm_out", norm_out, device);
  MIXPREC_CHECK(norm_out.dtype() == DType::F32 && norm_out.numel() == 1, kOp,
                ": norm_out must be F32 [1], got ", describe(norm_out));
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    MIXPREC_CHECK(g.defined(), kOp, ": gradient ", i, " is undefined; pass only defined gradients");
    on_device(kOp, "gradient", g, device);
    MIXPREC_CHECK(g.dtype() == DType::F32, kOp, ": gradient ", i, " is ", describe(g),
                  "; the gradients clipped in place must be F32");
  }
}

void count_taken_step(Device device, const Tensor& found_inf, const Tensor& taken) {
  constexpr const char* kOp = "count_taken_step";
  found_inf_flag(kOp, found_inf, device);
  taken_counter(kOp, taken, device);
}

// ---- multi-tensor optimizer steps ----------------------------------------------------------

namespace {

std::array<const Tensor*, 5> buffers_of(const AdamParamStep& s) {
  return {s.master, s.grad, s.exp_avg, s.exp_avg_sq, s.working};
}

std::array<const Tensor*, 5> buffers_of(const SgdParamStep& s) {
  return {s.master, s.grad, used_momentum(s.hyper, s.momentum), s.working, nullptr};
}

// The checks common to every step of a multi-tensor call: operands present, a table exactly
// on deferred steps, a flag on deferred calls, no memory shared between steps. `check_one`
// then checks the step as its per-parameter call does; its message gains the step's index.
template <class ParamStep, class CheckOne>
void param_steps(const char* op, Device device, const std::vector<ParamStep>& steps,
                 const Tensor* taken, const Tensor* found_inf, CheckOne check_one) {
  MIXPREC_CHECK(taken == nullptr || found_inf != nullptr, op,
                ": a deferred call (taken given) needs found_inf");
  // Checked here too, for a call of no steps (which reads the flag all the same).
  if (found_inf != nullptr) found_inf_flag(op, *found_inf, device);
  if (taken != nullptr) taken_counter(op, *taken, device);
  for (size_t i = 0; i < steps.size(); ++i) {
    const ParamStep& step = steps[i];
    MIXPREC_CHECK(step.master != nullptr && step.grad != nullptr, op, ": step ", i,
                  " has no ", step.master == nullptr ? "master" : "gradient");
    MIXPREC_CHECK((step.table != nullptr) == (taken != nullptr), op, ": step ", i,
                  taken != nullptr ? " has no rate table, which a deferred call needs"
                                   : " has a rate table, but the call is immediate (no taken)");
    try {
      check_one(step);
    } catch (const Error& e) {
      MIXPREC_FAIL(op, ": step ", i, " of ", steps.size(), ": ", e.what());
    }
  }
  std::vector<OwnedRange> ranges(5 * steps.size() + 2);
  OwnedRange* end = ranges.data();
  for (size_t i = 0; i < steps.size(); ++i) {
    for (const Tensor* t : buffers_of(steps[i])) end = add_range(end, t, i);
  }
  end = add_call_ranges(end, found_inf, taken);
  no_memory_shared(op, ranges.data(), end);
}

// Whether adam_hyper_with gives a and b's steps the same hyperparameters for every entry of
// one table: the fields it keeps from the base are equal.
bool same_base(const AdamHyper& a, const AdamHyper& b) {
  return a.beta1 == b.beta1 && a.beta2 == b.beta2 && a.eps == b.eps &&
         a.weight_decay == b.weight_decay && a.decoupled_weight_decay == b.decoupled_weight_decay;
}

}  // namespace

void adam_steps(Device device, const std::vector<AdamParamStep>& steps, const Tensor* taken,
                const Tensor* found_inf) {
  constexpr const char* kDeferred = "adam_step_deferred";
  // A deferred table checks count entries with two pow() each; optimizers hand one table to
  // every parameter that shares its rates (usually two tables for a model), so a table and
  // base already checked in this call are not checked again.
  std::vector<const AdamParamStep*> checked_tables;
  param_steps("adam_steps", device, steps, taken, found_inf, [&](const AdamParamStep& s) {
    MIXPREC_CHECK(s.exp_avg != nullptr && s.exp_avg_sq != nullptr,
                  "exp_avg and exp_avg_sq are both required");
    // As the per-parameter calls check a step, less the memory, which the call's sweep covers.
    if (taken == nullptr) {
      constexpr const char* kImmediate = "adam_step";
      adam_hyper(kImmediate, EntryName{}, s.hyper);
      adam_operands(kImmediate, device, *s.master, *s.grad, *s.exp_avg, *s.exp_avg_sq,
                    s.working, found_inf);
      return;
    }
    const bool checked =
        std::any_of(checked_tables.begin(), checked_tables.end(), [&](const AdamParamStep* p) {
          return p->table == s.table && same_base(p->hyper, s.hyper);
        });
    if (!checked) {
      adam_table(kDeferred, s.hyper, *s.table);
      checked_tables.push_back(&s);
    }
    adam_deferred_operands(kDeferred, device, *taken, *s.master, *s.grad, *s.exp_avg,
                           *s.exp_avg_sq, s.working, *found_inf);
  });
}

void sgd_steps(Device device, const std::vector<SgdParamStep>& steps, const Tensor* taken,
               const Tensor* found_inf) {
  param_steps("sgd_steps", device, steps, taken, found_inf, [&](const SgdParamStep& s) {
    // As the per-parameter calls check a step, less the memory, which the call's sweep covers.
    if (taken == nullptr) {
      sgd_operands("sgd_step", device, s.hyper, *s.master, *s.grad, s.momentum, s.working,
                   found_inf);
    } else {
      sgd_deferred_operands("sgd_step_deferred", device, s.hyper, *s.table, *taken, *s.master,
                            *s.grad, s.momentum, s.working, *found_inf);
    }
  });
}

}  // namespace mixprec::backend_checks
