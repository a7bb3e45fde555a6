// The multi-tensor optimizer steps of the CUDA backend (Backend::adam_steps / sgd_steps, the
// param-steps kernel) against the CPU backend: parameters of sizes around the kernel's
// 4096-element pieces and tiny ones, with every kind of working copy in one call, immediate
// and deferred (the entry picked by a counter on the device, a parameter whose table is too
// short sitting the step out), skipped by found_inf, and through the Adam optimizer. The call
// is one kernel launch whatever the number of parameters, and never waits for the device.
//
// The GPU multi-tensor call must give the GPU per-parameter calls' bits exactly, on any
// device. Against the CPU: the emulated backend runs the kernel's arithmetic through the host
// compiler, so there the bits must match too, with one exception: the master of an AdamW
// step with weight decay comes out 1 ulp apart in about a fifth of the elements, as when the
// decay product w * decay_factor is fused into the update's subtraction in one place and not
// in the other (-ffp-contract). Those masters are held to the per-parameter agreement tests'
// tolerance, like everything on a real device, where nvcc contracts multiply-adds of its own
// accord (test_cuda_amp.cpp). A working copy that is not compared with the CPU's bits must be
// the GPU master rounded once.
#include <cstdint>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/kernel_profile.h"
#include "cuda/kernels/param_steps.h"
#include "layers/parameter.h"
#include "optim/adam.h"
#include "tests/cuda/backend_agreement.h"
#include "tests/cuda/profiling_scope.h"
#include "tests/param_step_calls.h"

namespace mixprec::cuda_test {
namespace {

using mixprec_test::adam_step_deferred_on;
using mixprec_test::adam_step_on;
using mixprec_test::sgd_step_deferred_on;
using mixprec_test::sgd_step_on;

// Sizes one short of a piece, one piece, one past it, two pieces and a bit, two tiny ones,
// and empty ones first, in the middle and last (an empty parameter shares its first piece
// number with the next one, which the kernel's lookup of a piece's owner must skip).
constexpr int64_t kChunk = kernels::kParamStepChunk;
const std::vector<int64_t> kSizes = {0, kChunk - 1, kChunk, 0, kChunk + 1, 2 * kChunk + 3, 1, 3, 0};

// The working copy of each parameter in kSizes: none, 16-bit, or a distinct F32 tensor.
enum class Working { None, F16, BF16, F32 };
const std::vector<Working> kWorkings = {Working::F16,  Working::F16, Working::None,
                                        Working::BF16, Working::BF16, Working::F32,
                                        Working::BF16, Working::F16,  Working::F16};

std::vector<Tensor> workings_of(const std::vector<Tensor>& masters) {
  std::vector<Tensor> out;
  for (size_t i = 0; i < masters.size(); ++i) {
    switch (kWorkings[i]) {
      case Working::None: out.push_back(Tensor()); break;
      case Working::F16: out.push_back(masters[i].to(DType::F16)); break;
      case Working::BF16: out.push_back(masters[i].to(DType::BF16)); break;
      case Working::F32: out.push_back(masters[i].clone()); break;
    }
  }
  return out;
}

Tensor* ptr_or_null(Tensor& t) { return t.defined() ? &t : nullptr; }

// Every working copy that exists, overwritten with NaN bits: a step that updates its
// parameter must write each element, or the comparison fails.
void poison_all(std::vector<Tensor>& ts) {
  for (Tensor& t : ts) {
    if (t.defined()) poison(t);
  }
}

// Whether this build runs the kernels through the host compiler (see the header comment).
#if MIXPREC_CUDA_EMULATION
constexpr bool kEmulated = true;
#else
constexpr bool kEmulated = false;
#endif

// The results of a GPU call against the CPU's: bit for bit where `bits`, else within
// `tolerance`.
void expect_as_cpu(const Tensor& cpu, const Tensor& gpu, Tolerance tolerance, bool bits) {
  if (bits) expect_bits_equal(cpu, gpu);
  else expect_close(cpu, gpu, tolerance);
}

// A working copy: the CPU's bits where `bits`, else the GPU master rounded once.
void expect_working_as_cpu(const Tensor& cpu, const Tensor& gpu, const Tensor& gpu_master,
                           bool bits) {
  if (bits) {
    expect_bits_equal(cpu, gpu);
    return;
  }
  Tensor rounded = Tensor::empty(gpu.shape(), gpu.dtype());
  cpu_backend().cast(gpu_master.to(kCPU), rounded);
  expect_bits_equal(rounded, gpu);
}

// An AdamW step that shrinks the weight: its master is not compared bit for bit with the CPU
// (see the header comment).
bool decays_decoupled(const AdamHyper& h) {
  return h.decoupled_weight_decay && h.weight_decay != 0.0f;
}

// ---- Adam ------------------------------------------------------------------------------

// The operands of every parameter on one device.
struct AdamSet {
  std::vector<Tensor> master, grad, exp_avg, exp_avg_sq, working;

  AdamSet on(Device device) const {
    return {copies_on(master, device), copies_on(grad, device), copies_on(exp_avg, device),
            copies_on(exp_avg_sq, device), copies_on(working, device)};
  }
  // Pointers into this set: it must stay in place while the steps are used.
  std::vector<AdamParamStep> steps(const std::vector<AdamHyper>& hypers,
                                   const std::vector<AdamRateTable>* tables) {
    std::vector<AdamParamStep> out;
    for (size_t i = 0; i < master.size(); ++i) {
      out.push_back({hypers[i], tables != nullptr ? &(*tables)[i] : nullptr, &master[i],
                     &grad[i], &exp_avg[i], &exp_avg_sq[i], ptr_or_null(working[i])});
    }
    return out;
  }
};

// Mid-training operands (non-zero moments) for kSizes.
AdamSet adam_set(std::mt19937& rng) {
  AdamSet s;
  for (int64_t n : kSizes) {
    s.master.push_back(random_tensor({n}, DType::F32, rng));
    s.grad.push_back(random_tensor({n}, DType::F32, rng));
    s.exp_avg.push_back(random_tensor({n}, DType::F32, rng, -0.1f, 0.1f));
    s.exp_avg_sq.push_back(random_tensor({n}, DType::F32, rng, 0.0f, 0.01f));
  }
  s.working = workings_of(s.master);
  return s;
}

// Adam and AdamW, with and without weight decay, at different steps: parameter i's values
// differ from parameter k's, so a step that took another parameter's hyper would show.
std::vector<AdamHyper> adam_hypers() {
  std::vector<AdamHyper> hypers;
  for (size_t i = 0; i < kSizes.size(); ++i) {
    AdamHyper h;
    h.lr = 1e-3f * static_cast<float>(i + 1);
    h.beta2 = i % 2 == 0 ? 0.999f : 0.99f;
    h.eps = i % 3 == 0 ? 1e-8f : 1e-6f;
    h.weight_decay = i % 3 == 2 ? 0.0f : 0.05f * static_cast<float>(i + 1);
    h.decoupled_weight_decay = i % 2 == 1;
    h.set_step(1 + 3 * static_cast<int64_t>(i));
    hypers.push_back(h);
  }
  return hypers;
}

// Per-parameter entries j: steps t0 + j at a decaying rate, from each parameter's base.
std::vector<AdamRateTable> adam_tables(const std::vector<AdamHyper>& bases,
                                       const std::vector<int32_t>& counts) {
  REQUIRE(counts.size() == bases.size());
  std::vector<AdamRateTable> tables;
  for (size_t i = 0; i < bases.size(); ++i) {
    AdamRateTable t;
    t.count = counts[i];
    for (int32_t j = 0; j < t.count; ++j) {
      AdamHyper h = bases[i];
      h.lr = bases[i].lr * (1.0f - 0.01f * static_cast<float>(j));
      h.set_step(bases[i].step + j);
      t.entry[j] = rates_of(h);
    }
    tables.push_back(t);
  }
  return tables;
}

// The GPU set against the CPU set, parameter by parameter, stepped with `hypers`.
void expect_adam_as_cpu(const AdamSet& cpu, const AdamSet& gpu,
                        const std::vector<AdamHyper>& hypers) {
  for (size_t i = 0; i < cpu.master.size(); ++i) {
    INFO("parameter " << i << " [" << cpu.master[i].numel() << "]");
    const bool master_bits = kEmulated && !decays_decoupled(hypers[i]);
    expect_as_cpu(cpu.master[i], gpu.master[i], Tolerance{1e-6, 1e-7}, master_bits);
    expect_as_cpu(cpu.exp_avg[i], gpu.exp_avg[i], Tolerance{1e-6, 2e-6}, kEmulated);
    expect_as_cpu(cpu.exp_avg_sq[i], gpu.exp_avg_sq[i], Tolerance{1e-6, 1e-8}, kEmulated);
    if (cpu.working[i].defined())
      expect_working_as_cpu(cpu.working[i], gpu.working[i], gpu.master[i], master_bits);
  }
}

void expect_adam_bits_equal(const AdamSet& expected, const AdamSet& actual) {
  for (size_t i = 0; i < expected.master.size(); ++i) {
    INFO("parameter " << i << " [" << expected.master[i].numel() << "]");
    expect_bits_equal(expected.master[i], actual.master[i]);
    expect_bits_equal(expected.exp_avg[i], actual.exp_avg[i]);
    expect_bits_equal(expected.exp_avg_sq[i], actual.exp_avg_sq[i]);
    if (expected.working[i].defined())
      expect_bits_equal(expected.working[i], actual.working[i]);
  }
}

// ---- SGD -------------------------------------------------------------------------------

struct SgdSet {
  std::vector<Tensor> master, grad, momentum, working;

  SgdSet on(Device device) const {
    return {copies_on(master, device), copies_on(grad, device), copies_on(momentum, device),
            copies_on(working, device)};
  }
  std::vector<SgdParamStep> steps(const std::vector<SgdHyper>& hypers,
                                  const std::vector<SgdRateTable>* tables) {
    std::vector<SgdParamStep> out;
    for (size_t i = 0; i < master.size(); ++i) {
      out.push_back({hypers[i], tables != nullptr ? &(*tables)[i] : nullptr, &master[i],
                     &grad[i], ptr_or_null(momentum[i]), ptr_or_null(working[i])});
    }
    return out;
  }
};

// No momentum (and no buffer) for parameter 1; buffers for the others.
SgdSet sgd_set(std::mt19937& rng) {
  SgdSet s;
  for (size_t i = 0; i < kSizes.size(); ++i) {
    const int64_t n = kSizes[i];
    s.master.push_back(random_tensor({n}, DType::F32, rng));
    s.grad.push_back(random_tensor({n}, DType::F32, rng));
    s.momentum.push_back(i == 1 ? Tensor() : random_tensor({n}, DType::F32, rng, -0.5f, 0.5f));
  }
  s.working = workings_of(s.master);
  return s;
}

// No momentum; momentum on a first step and later ones, with dampening, Nesterov and weight
// decay in turn.
std::vector<SgdHyper> sgd_hypers() {
  std::vector<SgdHyper> hypers;
  for (size_t i = 0; i < kSizes.size(); ++i) {
    SgdHyper h;
    h.lr = 0.01f * static_cast<float>(i + 1);
    h.momentum = i == 1 ? 0.0f : 0.9f - 0.05f * static_cast<float>(i);
    h.dampening = i % 3 == 0 ? 0.1f : 0.0f;
    h.weight_decay = i % 2 == 0 ? 1e-2f : 0.0f;
    h.nesterov = i % 3 == 2;
    h.first_step = i == 0 || i == 4;
    hypers.push_back(h);
  }
  return hypers;
}

std::vector<SgdRateTable> sgd_tables(const std::vector<SgdHyper>& bases,
                                     const std::vector<int32_t>& counts) {
  REQUIRE(counts.size() == bases.size());
  std::vector<SgdRateTable> tables;
  for (size_t i = 0; i < bases.size(); ++i) {
    SgdRateTable t;
    t.count = counts[i];
    for (int32_t j = 0; j < t.count; ++j) {
      t.entry[j] = {bases[i].lr * (1.0f - 0.01f * static_cast<float>(j)),
                    bases[i].first_step && j == 0 ? 1 : 0};
    }
    tables.push_back(t);
  }
  return tables;
}

void expect_sgd_as_cpu(const SgdSet& cpu, const SgdSet& gpu) {
  for (size_t i = 0; i < cpu.master.size(); ++i) {
    INFO("parameter " << i << " [" << cpu.master[i].numel() << "]");
    expect_as_cpu(cpu.master[i], gpu.master[i], tolerance_for(DType::F32), kEmulated);
    if (cpu.momentum[i].defined())
      expect_as_cpu(cpu.momentum[i], gpu.momentum[i], tolerance_for(DType::F32), kEmulated);
    if (cpu.working[i].defined())
      expect_working_as_cpu(cpu.working[i], gpu.working[i], gpu.master[i], kEmulated);
  }
}

void expect_sgd_bits_equal(const SgdSet& expected, const SgdSet& actual) {
  for (size_t i = 0; i < expected.master.size(); ++i) {
    INFO("parameter " << i << " [" << expected.master[i].numel() << "]");
    expect_bits_equal(expected.master[i], actual.master[i]);
    if (expected.momentum[i].defined())
      expect_bits_equal(expected.momentum[i], actual.momentum[i]);
    if (expected.working[i].defined())
      expect_bits_equal(expected.working[i], actual.working[i]);
  }
}

// Whether each non-empty parameter's master changed from `before`.
std::vector<bool> masters_moved(const std::vector<Tensor>& before,
                                const std::vector<Tensor>& after) {
  std::vector<bool> moved;
  for (size_t i = 0; i < before.size(); ++i)
    moved.push_back(before[i].numel() > 0 && element_bits(before[i]) != element_bits(after[i]));
  return moved;
}

std::vector<bool> non_empty() {
  std::vector<bool> out;
  for (int64_t n : kSizes) out.push_back(n > 0);
  return out;
}

int64_t all_launches() {
  int64_t calls = 0;
  for (const KernelProfileRow& row : kernel_profile()) calls += row.calls;
  return calls;
}

std::string profile_names() {
  std::ostringstream names;
  for (const KernelProfileRow& row : kernel_profile())
    names << row.kernel << " x" << row.calls << " (" << row.site << ")\n";
  return names.str();
}

}  // namespace

// ---- immediate steps ---------------------------------------------------------------------

TEST_CASE("cuda adam_steps over mixed parameters matches the CPU and the per-parameter steps",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(301);
  const AdamSet initial = adam_set(rng);
  const std::vector<AdamHyper> hypers = adam_hypers();
  AdamSet cpu = initial.on(kCPU);
  for (size_t i = 0; i < kSizes.size(); ++i) {
    adam_step_on(cpu_backend(), hypers[i], cpu.master[i], cpu.grad[i], cpu.exp_avg[i],
                 cpu.exp_avg_sq[i], ptr_or_null(cpu.working[i]), nullptr);
  }
  // Without a flag, and with a clear one as unscale_and_check leaves it.
  for (bool with_flag : {false, true}) {
    INFO((with_flag ? "found_inf clear" : "no found_inf"));
    const Tensor clear = Tensor::zeros({1}, DType::F32, gpu());
    const Tensor* found_inf = with_flag ? &clear : nullptr;
    AdamSet together = initial.on(gpu());
    poison_all(together.working);
    const std::vector<AdamParamStep> steps = together.steps(hypers, nullptr);
    const uint64_t syncs = cuda_host_syncs();
    gpu_backend().adam_steps(steps, nullptr, found_inf);
    CHECK(cuda_host_syncs() == syncs);
    expect_adam_as_cpu(cpu, together, hypers);
    CHECK(masters_moved(initial.master, together.master) == non_empty());

    AdamSet each = initial.on(gpu());
    poison_all(each.working);
    for (size_t i = 0; i < kSizes.size(); ++i) {
      adam_step_on(gpu_backend(), hypers[i], each.master[i], each.grad[i], each.exp_avg[i],
                   each.exp_avg_sq[i], ptr_or_null(each.working[i]), found_inf);
    }
    expect_adam_bits_equal(each, together);
  }
}

TEST_CASE("cuda sgd_steps over mixed parameters matches the CPU and the per-parameter steps",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(302);
  const SgdSet initial = sgd_set(rng);
  const std::vector<SgdHyper> hypers = sgd_hypers();
  SgdSet cpu = initial.on(kCPU);
  for (size_t i = 0; i < kSizes.size(); ++i) {
    sgd_step_on(cpu_backend(), hypers[i], cpu.master[i], cpu.grad[i], ptr_or_null(cpu.momentum[i]),
                ptr_or_null(cpu.working[i]), nullptr);
  }
  SgdSet together = initial.on(gpu());
  poison_all(together.working);
  const std::vector<SgdParamStep> steps = together.steps(hypers, nullptr);
  const uint64_t syncs = cuda_host_syncs();
  gpu_backend().sgd_steps(steps, nullptr, nullptr);
  CHECK(cuda_host_syncs() == syncs);
  expect_sgd_as_cpu(cpu, together);
  CHECK(masters_moved(initial.master, together.master) == non_empty());
  // A first step (parameter 4) replaces whatever its buffer held.
  CHECK(element_bits(together.momentum[4]) != element_bits(initial.momentum[4]));

  SgdSet each = initial.on(gpu());
  poison_all(each.working);
  for (size_t i = 0; i < kSizes.size(); ++i) {
    sgd_step_on(gpu_backend(), hypers[i], each.master[i], each.grad[i],
                ptr_or_null(each.momentum[i]), ptr_or_null(each.working[i]), nullptr);
  }
  expect_sgd_bits_equal(each, together);
}

TEST_CASE("cuda adam_steps and sgd_steps with found_inf set leave every buffer untouched",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(303);
  const AdamSet adam_initial = adam_set(rng);
  const SgdSet sgd_initial = sgd_set(rng);
  const std::vector<AdamHyper> adam_hyper = adam_hypers();
  const std::vector<SgdHyper> sgd_hyper = sgd_hypers();
  const std::vector<int32_t> counts(kSizes.size(), 2);
  const std::vector<AdamRateTable> adam_table = adam_tables(adam_hyper, counts);
  const std::vector<SgdRateTable> sgd_table = sgd_tables(sgd_hyper, counts);
  const Tensor taken = taken_on(0, gpu());
  for (double flag : {1.0, std::nan("")}) {
    for (bool deferred : {false, true}) {
      INFO("flag " << flag << (deferred ? ", deferred" : ", immediate"));
      const Tensor found_inf = Tensor::full({1}, flag, DType::F32, gpu());
      AdamSet adam = adam_initial.on(gpu());
      SgdSet sgd = sgd_initial.on(gpu());
      const std::vector<AdamParamStep> adam_steps =
          adam.steps(adam_hyper, deferred ? &adam_table : nullptr);
      const std::vector<SgdParamStep> sgd_steps =
          sgd.steps(sgd_hyper, deferred ? &sgd_table : nullptr);
      const uint64_t syncs = cuda_host_syncs();
      gpu_backend().adam_steps(adam_steps, deferred ? &taken : nullptr, &found_inf);
      gpu_backend().sgd_steps(sgd_steps, deferred ? &taken : nullptr, &found_inf);
      CHECK(cuda_host_syncs() == syncs);
      expect_adam_bits_equal(adam_initial, adam);
      expect_sgd_bits_equal(sgd_initial, sgd);
    }
  }
}

// ---- deferred steps ----------------------------------------------------------------------

TEST_CASE("cuda deferred adam_steps and sgd_steps pick entry j from the device counter",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(304);
  const AdamSet adam_initial = adam_set(rng);
  const SgdSet sgd_initial = sgd_set(rng);
  const std::vector<AdamHyper> adam_base = adam_hypers();
  const std::vector<SgdHyper> sgd_base = sgd_hypers();
  // Parameter 4 has a table of one entry: from j = 1 on it sits the step out.
  const std::vector<int32_t> counts = {2, 3, 2, 5, 1, 4, 2, kMaxDeferredSteps, 3};
  const std::vector<AdamRateTable> adam_table = adam_tables(adam_base, counts);
  const std::vector<SgdRateTable> sgd_table = sgd_tables(sgd_base, counts);
  const Tensor cpu_clear = Tensor::zeros({1});
  const Tensor gpu_clear = Tensor::zeros({1}, DType::F32, gpu());
  // 0 and 1, then a count past every table: nothing moves.
  for (int32_t j : {0, 1, kMaxDeferredSteps}) {
    INFO("taken " << j);
    const Tensor cpu_taken = taken_on(j, kCPU), gpu_taken = taken_on(j, gpu());
    AdamSet adam_cpu = adam_initial.on(kCPU);
    SgdSet sgd_cpu = sgd_initial.on(kCPU);
    for (size_t i = 0; i < kSizes.size(); ++i) {
      adam_step_deferred_on(cpu_backend(), adam_base[i], adam_table[i], cpu_taken,
                            adam_cpu.master[i], adam_cpu.grad[i], adam_cpu.exp_avg[i],
                            adam_cpu.exp_avg_sq[i], ptr_or_null(adam_cpu.working[i]), cpu_clear);
      sgd_step_deferred_on(cpu_backend(), sgd_base[i], sgd_table[i], cpu_taken, sgd_cpu.master[i],
                           sgd_cpu.grad[i], ptr_or_null(sgd_cpu.momentum[i]),
                           ptr_or_null(sgd_cpu.working[i]), cpu_clear);
    }
    // Poisoned working copies only where every parameter is updated (j = 0); a parameter
    // that sits the step out keeps its copy.
    AdamSet adam = adam_initial.on(gpu());
    SgdSet sgd = sgd_initial.on(gpu());
    if (j == 0) {
      poison_all(adam.working);
      poison_all(sgd.working);
    }
    const std::vector<AdamParamStep> adam_steps = adam.steps(adam_base, &adam_table);
    const std::vector<SgdParamStep> sgd_steps = sgd.steps(sgd_base, &sgd_table);
    const uint64_t syncs = cuda_host_syncs();
    gpu_backend().adam_steps(adam_steps, &gpu_taken, &gpu_clear);
    gpu_backend().sgd_steps(sgd_steps, &gpu_taken, &gpu_clear);
    CHECK(cuda_host_syncs() == syncs);
    expect_adam_as_cpu(adam_cpu, adam, adam_base);
    expect_sgd_as_cpu(sgd_cpu, sgd);

    std::vector<bool> expected_moves;
    for (size_t i = 0; i < kSizes.size(); ++i)
      expected_moves.push_back(kSizes[i] > 0 && j < counts[i]);
    CHECK(masters_moved(adam_initial.master, adam.master) == expected_moves);
    CHECK(masters_moved(sgd_initial.master, sgd.master) == expected_moves);
    if (j == kMaxDeferredSteps) {
      expect_adam_bits_equal(adam_initial, adam);
      expect_sgd_bits_equal(sgd_initial, sgd);
    }
  }
}

// ---- alignment -----------------------------------------------------------------------------

TEST_CASE("cuda param_steps kernel updates buffers one element off their alignment", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  // Tensors are 256-byte aligned; raw pointers one element into the buffers reach the
  // kernel's element-by-element path, in the same launch as an aligned parameter.
  CudaBackend& backend = dynamic_cast<CudaBackend&>(gpu_backend());
  std::mt19937 rng(305);
  const std::vector<int64_t> sizes = {kChunk + 1, kChunk + 5, 3};
  const std::vector<int64_t> offsets = {1, 0, 1};
  const std::vector<DType> workings = {DType::F16, DType::BF16, DType::F16};
  const std::vector<AdamHyper> hypers = adam_hypers();

  std::vector<Tensor> masters, grads, avgs, avg_sqs;  // host, offset + numel elements
  std::vector<Tensor> gm, gg, ga, gv, gw;              // device
  std::vector<kernels::AdamStepSource> sources(sizes.size());
  std::vector<AdamStepRates> rates;
  for (size_t i = 0; i < sizes.size(); ++i) rates.push_back(rates_of(hypers[i]));
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t n = sizes[i] + offsets[i];
    masters.push_back(random_tensor({n}, DType::F32, rng));
    grads.push_back(random_tensor({n}, DType::F32, rng));
    avgs.push_back(random_tensor({n}, DType::F32, rng, -0.1f, 0.1f));
    avg_sqs.push_back(random_tensor({n}, DType::F32, rng, 0.0f, 0.01f));
    gm.push_back(masters[i].to(gpu()));
    gg.push_back(grads[i].to(gpu()));
    ga.push_back(avgs[i].to(gpu()));
    gv.push_back(avg_sqs[i].to(gpu()));
    gw.push_back(poisoned({n}, workings[i]));
    const int64_t o = offsets[i];
    kernels::AdamStepSource& s = sources[i];
    s.hyper = hypers[i];
    s.rates = &rates[i];
    s.rates_count = 1;
    s.buffers.master = gm[i].data_as<float>() + o;
    s.buffers.grad = gg[i].data_as<float>() + o;
    s.buffers.state0 = ga[i].data_as<float>() + o;
    s.buffers.state1 = gv[i].data_as<float>() + o;
    s.buffers.working = static_cast<unsigned char*>(gw[i].data()) + o * 2;
    s.buffers.working_dtype = static_cast<int32_t>(workings[i]);
    s.buffers.numel = sizes[i];
  }
  const kernels::ParamStepTable table = kernels::make_param_step_table("test", sources);
  void* device_table = backend.allocate(table.bytes.size());
  backend.copy_from_host(device_table, table.bytes.data(), table.bytes.size());
  kernels::adam_steps(table, device_table, nullptr, nullptr, backend.stream());
  backend.synchronize();
  backend.deallocate(device_table, table.bytes.size());

  for (size_t i = 0; i < sizes.size(); ++i) {
    INFO("parameter " << i << " [" << sizes[i] << "], offset " << offsets[i]);
    // The CPU step on the same elements.
    const int64_t n = sizes[i], o = offsets[i];
    auto part = [&](const Tensor& t) {
      const std::vector<float> v = t.to_float_vector();
      return Tensor::from_vector(std::vector<float>(v.begin() + o, v.end()), {n});
    };
    Tensor m = part(masters[i]), a = part(avgs[i]), v = part(avg_sqs[i]);
    Tensor w = Tensor::empty({n}, workings[i]);
    adam_step_on(cpu_backend(), hypers[i], m, part(grads[i]), a, v, &w, nullptr);
    const bool master_bits = kEmulated && !decays_decoupled(hypers[i]);
    expect_as_cpu(m, part(gm[i]), Tolerance{1e-6, 1e-7}, master_bits);
    expect_as_cpu(a, part(ga[i]), Tolerance{1e-6, 2e-6}, kEmulated);
    expect_as_cpu(v, part(gv[i]), Tolerance{1e-6, 1e-8}, kEmulated);
    const std::vector<uint32_t> working_bits = element_bits(gw[i]);
    std::vector<uint32_t> expected = element_bits(w);
    if (!master_bits) {
      Tensor rounded = Tensor::empty({n}, workings[i]);
      cpu_backend().cast(part(gm[i]), rounded);
      expected = element_bits(rounded);
    }
    CHECK(std::vector<uint32_t>(working_bits.begin() + o, working_bits.end()) == expected);
    if (o > 0) {
      // The element before the range is untouched.
      CHECK(element_bits(gm[i])[0] == element_bits(masters[i])[0]);
      CHECK(element_bits(gv[i])[0] == element_bits(avg_sqs[i])[0]);
      CHECK(working_bits[0] == poison_bits(workings[i]));
    }
  }
}

// ---- one launch, no waiting ----------------------------------------------------------------

TEST_CASE("cuda adam_steps and sgd_steps over six parameters are one param_steps_kernel launch",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(306);
  AdamSet adam = adam_set(rng).on(gpu());
  SgdSet sgd = sgd_set(rng).on(gpu());
  // The six parameters that are not empty.
  const auto non_empty = [](auto steps) {
    decltype(steps) kept;
    for (size_t i = 0; i < steps.size(); ++i)
      if (kSizes[i] > 0) kept.push_back(steps[i]);
    REQUIRE(kept.size() == 6);
    return kept;
  };
  const std::vector<AdamParamStep> adam_steps = non_empty(adam.steps(adam_hypers(), nullptr));
  const std::vector<SgdParamStep> sgd_steps = non_empty(sgd.steps(sgd_hypers(), nullptr));
  const std::vector<AdamRateTable> tables =
      adam_tables(adam_hypers(), {2, 2, 3, 2, 1, 2, 2, 4, 2});
  const std::vector<AdamParamStep> deferred = non_empty(adam.steps(adam_hypers(), &tables));
  const Tensor taken = taken_on(1, gpu());
  const Tensor clear = Tensor::zeros({1}, DType::F32, gpu());

  struct Call {
    const char* name;
    std::function<void()> run;
  };
  const std::vector<Call> calls = {
      {"adam_steps", [&] { gpu_backend().adam_steps(adam_steps, nullptr, nullptr); }},
      {"sgd_steps", [&] { gpu_backend().sgd_steps(sgd_steps, nullptr, nullptr); }},
      {"deferred adam_steps", [&] { gpu_backend().adam_steps(deferred, &taken, &clear); }}};
  for (const Call& call : calls) {
    INFO(call.name);
    const ProfilingScope profiling;
    call.run();
    INFO(profile_names());
    CHECK(launches_of("param_steps_kernel") == 1);
    CHECK(all_launches() == 1);
  }
}

// ---- through the optimizer -----------------------------------------------------------------

TEST_CASE("cuda Adam over six FP16 parameters steps as on the CPU", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(307);
  // Matrices (which AdamW decays) and vectors (which it does not), sizes around a piece.
  const std::vector<Shape> shapes = {{64, 64}, {kChunk + 1}, {3}, {2, kChunk + 3}, {1}, {5, 7}};
  const int kSteps = 2;
  std::vector<Tensor> values;
  std::vector<std::vector<Tensor>> grads(kSteps + 1);
  for (const Shape& s : shapes) values.push_back(random_tensor(s, DType::F32, rng));
  for (auto& step_grads : grads) {
    for (const Shape& s : shapes) step_grads.push_back(random_tensor(s, DType::F32, rng));
  }

  for (bool decoupled : {false, true}) {
    INFO((decoupled ? "AdamW" : "Adam"));
    AdamOptions options;
    options.lr = 2e-3;
    options.weight_decay = 0.05;
    // Both devices run the same schedule of calls: kSteps steps, then a deferred one.
    auto train = [&](Device device, bool profile_last_step) {
      std::vector<Parameter> params;
      for (size_t i = 0; i < shapes.size(); ++i) {
        const Tensor value = device.is_cpu() ? values[i] : values[i].to(device);
        params.emplace_back(std::string("p").append(std::to_string(i)), value);
        params.back().set_working_dtype(DType::F16);
      }
      std::unique_ptr<Adam> opt = decoupled ? std::make_unique<AdamW>(params, options)
                                            : std::make_unique<Adam>(params, options);
      for (int s = 0; s < kSteps; ++s) {
        for (size_t i = 0; i < params.size(); ++i) {
          params[i].working().set_grad(device.is_cpu() ? grads[s][i].clone()
                                                       : grads[s][i].to(device));
        }
        if (profile_last_step && s == kSteps - 1) {
          // The moments exist by now: the step is the one launch and nothing else.
          const ProfilingScope profiling;
          opt->step();
          INFO(profile_names());
          CHECK(launches_of("param_steps_kernel") == 1);
          CHECK(all_launches() == 1);
        } else {
          opt->step();
        }
      }
      for (size_t i = 0; i < params.size(); ++i) {
        params[i].working().set_grad(device.is_cpu() ? grads[kSteps][i].clone()
                                                     : grads[kSteps][i].to(device));
      }
      const StepGate gate{Tensor::zeros({1}, DType::F32, device),
                          Tensor::zeros({1}, DType::I32, device), {opt->lr()}};
      opt->step(&gate);
      opt->settle(1);
      CHECK(opt->steps_taken() == kSteps + 1);
      std::vector<Tensor> out;
      for (size_t i = 0; i < params.size(); ++i) {
        out.push_back(params[i].master());
        out.push_back(params[i].working());
        out.push_back(opt->exp_avg(i));
        out.push_back(opt->exp_avg_sq(i));
      }
      return out;
    };
    const std::vector<Tensor> expected = train(kCPU, false);
    const std::vector<Tensor> actual = train(gpu(), true);
    for (size_t i = 0; i < shapes.size(); ++i) {
      INFO("parameter " << i);
      // AdamW decays the matrices only (decay_matrices_only).
      const bool master_bits = kEmulated && !(decoupled && shapes[i].size() >= 2);
      const Tensor& gpu_master = actual[4 * i];
      expect_as_cpu(expected[4 * i], gpu_master, Tolerance{1e-5, 1e-6}, master_bits);
      expect_working_as_cpu(expected[4 * i + 1], actual[4 * i + 1], gpu_master, master_bits);
      expect_as_cpu(expected[4 * i + 2], actual[4 * i + 2], Tolerance{1e-5, 1e-6}, kEmulated);
      expect_as_cpu(expected[4 * i + 3], actual[4 * i + 3], Tolerance{1e-5, 1e-8}, kEmulated);
      CHECK(element_bits(gpu_master) != element_bits(values[i]));
    }
  }
}

}  // namespace mixprec::cuda_test

namespace mixprec::cuda_test {
namespace {

// Two parameters, `first` = {1, 2} on the CPU and "on_gpu" = {3, 4} on the GPU, the first
// frozen or not.
std::vector<Parameter> cpu_and_gpu_params(const char* first, bool freeze_first) {
  std::vector<Parameter> params;
  params.emplace_back(first, Tensor::from_vector({1.0f, 2.0f}, {2}));
  params.emplace_back("on_gpu", Tensor::from_vector({3.0f, 4.0f}, {2}).to(gpu()));
  params[0].set_requires_grad(!freeze_first);
  return params;
}

}  // namespace

TEST_CASE("cuda deferred Adam refuses parameters on two devices before updating any",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  // The flag and the count of a deferred step live on one device; a parameter elsewhere is
  // refused up front, so the one on the flag's device is not left updated alone.
  std::vector<Parameter> params = cpu_and_gpu_params("on_cpu", false);
  Adam adam(params);
  params[0].working().set_grad(Tensor::from_vector({0.5f, 0.5f}, {2}));
  params[1].working().set_grad(Tensor::from_vector({0.5f, 0.5f}, {2}).to(gpu()));
  const std::vector<float> before = params[0].master().to_float_vector();
  const StepGate on_cpu{Tensor::zeros({1}), Tensor::zeros({1}, DType::I32), {adam.lr()}};
  CHECK_THROWS_WITH(adam.step(&on_cpu),
                    Catch::Contains("'on_gpu' is on cuda:0") &&
                        Catch::Contains("keep the trainable parameters there"));
  CHECK(params[0].master().to_float_vector() == before);
  CHECK(params[1].master().to_float_vector() == std::vector<float>{3.0f, 4.0f});
  CHECK_FALSE(adam.unsettled());
}

TEST_CASE("cuda deferred Adam runs on its trainable parameters' device past a frozen one",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  // A frozen parameter is not updated, so where it lives does not matter: the deferred step
  // runs on the device of the trainable ones, with its flag there.
  std::vector<Parameter> params = cpu_and_gpu_params("frozen_on_cpu", true);
  Adam adam(params);
  params[1].working().set_grad(Tensor::from_vector({0.5f, 0.5f}, {2}).to(gpu()));
  const StepGate on_gpu{Tensor::zeros({1}, DType::F32, gpu()),
                        Tensor::zeros({1}, DType::I32, gpu()), {adam.lr()}};
  adam.step(&on_gpu);
  CHECK(adam.unsettled());
  CHECK(params[0].master().to_float_vector() == std::vector<float>{1.0f, 2.0f});
  CHECK(params[1].master().to_float_vector() != std::vector<float>{3.0f, 4.0f});
  // A flag on the frozen parameter's device is refused, naming the trainable one's.
  const StepGate on_cpu{Tensor::zeros({1}), Tensor::zeros({1}, DType::I32), {adam.lr()}};
  CHECK_THROWS_WITH(adam.step(&on_cpu), Catch::Contains("'on_gpu' is on cuda:0") &&
                                            Catch::Contains("flag and count are on cpu"));
}

}  // namespace mixprec::cuda_test
