// Mixed-precision primitives of the CPU backend: the fused unscale-and-check of an
// optimizer's gradients, per-tensor sums of squares (gradient clipping), the fused SGD and
// Adam/AdamW steps, the dynamic loss-scale update, and their deferred forms (the scale, the
// clip and the step's skip decided from tensors rather than host values). The per-element
// math is core/math/amp.h, shared with the CUDA backend; this file adds validation, loops and
// the rounding on store.
//
// Every loop is either elementwise or reduces in fixed-size blocks whose partial sums are
// added in index order, so no result depends on the OpenMP thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "core/backend_checks.h"
#include "core/cpu/blocks.h"
#include "core/cpu/common.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/dispatch.h"
#include "core/error.h"
#include "core/half.h"
#include "core/math/amp.h"
#include "core/tensor.h"

namespace mixprec {
namespace {

using cpu::kParallelWork;
using cpu::kParallelWorkCheap;

// Elements per FP32 scratch block.
constexpr int64_t kBlock = 512;
// Elements per partial sum of squares; the partials of one tensor are added in order.
constexpr int64_t kReduceChunk = int64_t{1} << 13;
// Elements per block inside one partial sum (see sum_squares_run).
constexpr int64_t kRunBlock = 256;

// ---- unscale ---------------------------------------------------------------------------

// Unscales n elements in place (unless `write` is false) and returns how many were
// non-finite as they arrived or after unscaling.
template <class T>
int64_t unscale_elements(T* p, int64_t n, double inv_scale, bool write) {
  int64_t bad = 0;
  if (!write) {
#pragma omp parallel for schedule(static) reduction(+ : bad) if (n > kParallelWorkCheap)
    for (int64_t i = 0; i < n; ++i) bad += is_finite_element(p[i]) ? 0 : 1;
    return bad;
  }
#pragma omp parallel for schedule(static) reduction(+ : bad) if (n > kParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    bool element_bad = false;
    p[i] = unscale_and_check_value(p[i], inv_scale, element_bad);
    bad += element_bad ? 1 : 0;
  }
  return bad;
}

// ---- sums of squares -------------------------------------------------------------------

// Sum of squares of a contiguous run in FP32: eight interleaved accumulators over blocks of
// kRunBlock, blocks added in order, so the order is fixed by n alone and the rounding error
// grows with kRunBlock / 8 + n / kRunBlock rather than with n.
template <class T>
float sum_squares_run(const void* data, int64_t begin, int64_t n) {
  constexpr int kLanes = 8;
  const T* p = static_cast<const T*>(data) + begin;
  float buf[kRunBlock];
  float total = 0.0f;
  for (int64_t b = 0; b < n; b += kRunBlock) {
    const int64_t len = std::min(kRunBlock, n - b);
    const float* v = cpu::load_f32(p + b, buf, len);
    float lane[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= len; i += kLanes)
      for (int j = 0; j < kLanes; ++j) lane[j] += v[i + j] * v[i + j];
    float block = 0.0f;
    for (; i < len; ++i) block += v[i] * v[i];
    for (int j = 0; j < kLanes; ++j) block += lane[j];
    total += block;
  }
  return total;
}

using SumSquaresFn = float (*)(const void*, int64_t, int64_t);

// One partial sum: chunk [begin, begin + len) of tensor `index`.
struct NormTask {
  size_t index;
  int64_t begin;
  int64_t len;
};

// ---- SGD -------------------------------------------------------------------------------

// W is the working copy's storage type (float when there is none, or an F32 copy). The
// block of new master values is rounded into the working copy right after it is written,
// with the bulk converters (bit-identical to from_float<W>).
// (The arrays do not overlap, as in adam_elements.)
template <class W>
void sgd_elements(const SgdHyper& hyper, float* __restrict w, const float* __restrict g,
                  float* __restrict buf, W* working, int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n > kParallelWork)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t begin = blk * kBlock, end = std::min(n, begin + kBlock);
    for (int64_t i = begin; i < end; ++i) {
      float b = buf != nullptr ? buf[i] : 0.0f;
      sgd_update(w[i], g[i], b, hyper);
      if (buf != nullptr) buf[i] = b;
    }
    if (working != nullptr) cpu::store_f32(w + begin, working + begin, end - begin);
  }
}

// ---- Adam ------------------------------------------------------------------------------

// As sgd_elements, with the two moment buffers.
// The arrays are declared not to overlap (they are distinct tensors): otherwise a store to
// w[i] might change the others, and the hyperparameters, as far as the compiler knows, and
// the loop stays scalar.
template <class W>
void adam_elements(const AdamHyper& hyper, float* __restrict w, const float* __restrict g,
                   float* __restrict m, float* __restrict v, W* working, int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n > kParallelWork)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t begin = blk * kBlock, end = std::min(n, begin + kBlock);
    for (int64_t i = begin; i < end; ++i) adam_update(w[i], g[i], m[i], v[i], hyper);
    if (working != nullptr) cpu::store_f32(w + begin, working + begin, end - begin);
  }
}

// A NaN flag counts as set (NaN != 0).
bool flag_set(const Tensor* found_inf) {
  return found_inf != nullptr && found_inf->data_as<float>()[0] != 0.0f;
}

// The unscale pass of both unscale primitives, after their validation.
void unscale_grads(const char* op, const std::vector<Tensor>& grads, double inv_scale,
                   Tensor& found_inf, Tensor& tensor_flags) {
  // inv_scale == 1 is a pure check: no store at all, so the bits (NaN payloads included)
  // stay exactly as they were.
  const bool write = inv_scale != 1.0;
  int32_t* flags = tensor_flags.data_as<int32_t>();
  bool any = false;
  for (size_t i = 0; i < grads.size(); ++i) {
    Tensor g = grads[i];
    const int64_t bad = MIXPREC_DISPATCH_FLOATING(g.dtype(), op, [&] {
      return unscale_elements(g.data_as<scalar_t>(), g.numel(), inv_scale, write);
    });
    flags[i] = bad > 0 ? 1 : 0;
    any = any || bad > 0;
  }
  if (any) found_inf.data_as<float>()[0] = 1.0f;
}

// One parameter's SGD update, after validation and the skip decision.
void apply_sgd(const char* op, const SgdHyper& hyper, Tensor& master, const Tensor& grad,
               Tensor* momentum, Tensor* working) {
  const bool use_momentum = hyper.momentum != 0.0f;
  const int64_t n = master.numel();
  float* w = master.data_as<float>();
  const float* g = grad.data_as<float>();
  float* buf = use_momentum ? momentum->data_as<float>() : nullptr;
  if (working == nullptr) return sgd_elements<float>(hyper, w, g, buf, nullptr, n);
  MIXPREC_DISPATCH_FLOATING(working->dtype(), op, [&] {
    sgd_elements(hyper, w, g, buf, working->data_as<scalar_t>(), n);
  });
}

// One parameter's Adam update, after validation and the skip decision.
void apply_adam(const char* op, const AdamHyper& hyper, Tensor& master, const Tensor& grad,
                Tensor& exp_avg, Tensor& exp_avg_sq, Tensor* working) {
  const int64_t n = master.numel();
  float* w = master.data_as<float>();
  const float* g = grad.data_as<float>();
  float* m = exp_avg.data_as<float>();
  float* v = exp_avg_sq.data_as<float>();
  if (working == nullptr) return adam_elements<float>(hyper, w, g, m, v, nullptr, n);
  MIXPREC_DISPATCH_FLOATING(working->dtype(), op, [&] {
    adam_elements(hyper, w, g, m, v, working->data_as<scalar_t>(), n);
  });
}

// Through memcpy: the tensor's storage is only guaranteed the alignment of an int32.
DynamicScaleState read_scale_state(const Tensor& state) {
  DynamicScaleState s;
  std::memcpy(&s, state.data(), sizeof s);
  return s;
}

// The entry of a deferred step's table that taken[0] selects, or null when it is outside
// [0, count) (then nothing is written).
template <class Table>
const auto* deferred_entry(const Table& table, const Tensor& taken) {
  const int32_t j = taken.data_as<int32_t>()[0];
  return j >= 0 && j < table.count ? &table.entry[j] : nullptr;
}

// The hyperparameters of one step of a validated call: its own, or (taken given) those of
// entry taken[0] of its table; none when that is past the table.
std::optional<AdamHyper> step_hyper(const AdamParamStep& s, const Tensor* taken) {
  if (taken == nullptr) return s.hyper;
  const AdamStepRates* rates = deferred_entry(*s.table, *taken);
  if (rates == nullptr) return std::nullopt;
  return adam_hyper_with(s.hyper, *rates);
}

std::optional<SgdHyper> step_hyper(const SgdParamStep& s, const Tensor* taken) {
  if (taken == nullptr) return s.hyper;
  const SgdStepRates* rates = deferred_entry(*s.table, *taken);
  if (rates == nullptr) return std::nullopt;
  return sgd_hyper_with(s.hyper, *rates);
}

// The updates of a validated call, in order, each with its step_hyper (a step past its table
// is skipped); nothing when found_inf is set. `op` names the primitive in a dtype error.
void run_adam_steps(const char* op, const std::vector<AdamParamStep>& steps, const Tensor* taken,
                    const Tensor* found_inf) {
  if (steps.empty() || flag_set(found_inf)) return;
  for (const AdamParamStep& s : steps) {
    if (const std::optional<AdamHyper> hyper = step_hyper(s, taken))
      apply_adam(op, *hyper, *s.master, *s.grad, *s.exp_avg, *s.exp_avg_sq, s.working);
  }
}

void run_sgd_steps(const char* op, const std::vector<SgdParamStep>& steps, const Tensor* taken,
                   const Tensor* found_inf) {
  if (steps.empty() || flag_set(found_inf)) return;
  for (const SgdParamStep& s : steps) {
    if (const std::optional<SgdHyper> hyper = step_hyper(s, taken))
      apply_sgd(op, *hyper, *s.master, *s.grad, s.momentum, s.working);
  }
}

}  // namespace

void CpuBackend::unscale_and_check(const std::vector<Tensor>& grads, double inv_scale,
                                   Tensor& found_inf, Tensor& tensor_flags) {
  backend_checks::unscale_and_check(kCPU, grads, inv_scale, found_inf, tensor_flags);
  unscale_grads("unscale_and_check", grads, inv_scale, found_inf, tensor_flags);
}

void CpuBackend::squared_norms(const std::vector<Tensor>& xs, Tensor& out) {
  constexpr const char* kOp = "squared_norms";
  backend_checks::squared_norms(kCPU, xs, out);

  std::vector<SumSquaresFn> fns(xs.size());
  std::vector<NormTask> tasks;
  int64_t total = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    fns[i] = MIXPREC_DISPATCH_FLOATING(x.dtype(), kOp, [&] {
      return static_cast<SumSquaresFn>(&sum_squares_run<scalar_t>);
    });
    const int64_t n = x.numel();
    for (int64_t begin = 0; begin < n; begin += kReduceChunk)
      tasks.push_back({i, begin, std::min(kReduceChunk, n - begin)});
    total += n;
  }

  // The chunks of all tensors form one task list, so many small tensors spread over the
  // threads as well as one large one does.
  std::vector<float> partial(tasks.size());
  const int64_t count = static_cast<int64_t>(tasks.size());
#pragma omp parallel for schedule(static) if (total > kParallelWork && count > 1)
  for (int64_t t = 0; t < count; ++t) {
    const NormTask& task = tasks[static_cast<size_t>(t)];
    partial[static_cast<size_t>(t)] = fns[task.index](xs[task.index].data(), task.begin, task.len);
  }

  // Chunk sums are combined in double and rounded once, so a tensor of many chunks does not
  // add one FP32 rounding per chunk.
  std::vector<double> sums(xs.size(), 0.0);
  for (size_t t = 0; t < tasks.size(); ++t) sums[tasks[t].index] += partial[t];
  float* o = out.data_as<float>();
  for (size_t i = 0; i < xs.size(); ++i) o[i] = static_cast<float>(sums[i]);
}

void CpuBackend::update_loss_scale(const DynamicScaleRule& rule, Tensor& state,
                                   const Tensor& found_inf) {
  backend_checks::update_loss_scale(kCPU, rule, state, found_inf);
  DynamicScaleState s = read_scale_state(state);
  update_dynamic_scale(rule, s, flag_set(&found_inf));
  std::memcpy(state.data(), &s, sizeof s);
}

// ---- deferred steps ------------------------------------------------------------------------

void CpuBackend::loss_scale_factor(const Tensor& scale_state, double weight, Tensor& out) {
  backend_checks::loss_scale_factor(kCPU, scale_state, weight, out);
  out.data_as<float>()[0] = static_cast<float>(read_scale_state(scale_state).scale * weight);
}

void CpuBackend::unscale_and_check_on_device(const std::vector<Tensor>& grads,
                                             const Tensor& scale_state, Tensor& found_inf,
                                             Tensor& tensor_flags) {
  backend_checks::unscale_and_check_on_device(kCPU, grads, scale_state, found_inf, tensor_flags);
  const double inv_scale = 1.0 / read_scale_state(scale_state).scale;
  unscale_grads("unscale_and_check_on_device", grads, inv_scale, found_inf, tensor_flags);
}

void CpuBackend::clip_by_total_norm(const std::vector<Tensor>& grads, const Tensor& squared_sums,
                                    double max_norm, Tensor& norm_out) {
  backend_checks::clip_by_total_norm(kCPU, grads, squared_sums, max_norm, norm_out);
  const float* sums = squared_sums.data_as<float>();
  double total = 0.0;
  for (size_t i = 0; i < grads.size(); ++i) total += static_cast<double>(sums[i]);
  const double norm = std::sqrt(total);
  norm_out.data_as<float>()[0] = static_cast<float>(norm);
  const double coef = clip_coefficient(norm, max_norm);
  if (!(coef < 1.0)) return;
  // affine loads each block before storing it, so scaling in place is safe.
  for (const Tensor& g : grads) {
    Tensor inout = g;
    affine(inout, static_cast<float>(coef), 0.0f, inout);
  }
}

void CpuBackend::adam_steps(const std::vector<AdamParamStep>& steps, const Tensor* taken,
                            const Tensor* found_inf) {
  backend_checks::adam_steps(kCPU, steps, taken, found_inf);
  run_adam_steps("adam_steps", steps, taken, found_inf);
}

void CpuBackend::sgd_steps(const std::vector<SgdParamStep>& steps, const Tensor* taken,
                           const Tensor* found_inf) {
  backend_checks::sgd_steps(kCPU, steps, taken, found_inf);
  run_sgd_steps("sgd_steps", steps, taken, found_inf);
}

void CpuBackend::count_taken_step(const Tensor& found_inf, Tensor& taken) {
  backend_checks::count_taken_step(kCPU, found_inf, taken);
  if (!flag_set(&found_inf)) taken.data_as<int32_t>()[0] += 1;
}

}  // namespace mixprec
