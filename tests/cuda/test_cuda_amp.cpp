// The mixed-precision kernels: the multi-tensor unscale-and-check, per-tensor sums of squares,
// the fused SGD and Adam/AdamW steps and the dynamic loss-scale update, CUDA against the CPU
// backend, and their device-side flags and state.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "backend_agreement.h"
#include "cuda/cuda_backend.h"
#include "cuda/kernels/amp.h"
#include "cuda/kernels/param_steps.h"
#include "cuda_backend_access.h"
#include "tests/param_step_calls.h"

namespace {

using mixprec_test::adam_step_deferred_on;
using mixprec_test::adam_step_on;
using mixprec_test::sgd_step_deferred_on;
using mixprec_test::sgd_step_on;

using namespace mixprec;
using namespace mixprec::cuda_test;

struct Spec {
  DType dtype;
  int64_t numel;
};

// Mixed dtypes, odd sizes, one element, an empty tensor, and tensors of several chunks
// (kernels::kMultiTensorChunk elements each).
const std::vector<Spec> kGradSpecs = {{DType::F32, 1023}, {DType::F16, 4097},  {DType::BF16, 7},
                                      {DType::F32, 1},    {DType::F16, 70000}, {DType::BF16, 0},
                                      {DType::F32, 2 * 65536 + 3}};

// Gradients as a loss scaled by `scale` would leave them: values in (-2, 2) * scale.
std::vector<Tensor> scaled_grads(std::mt19937& rng, double scale) {
  std::vector<Tensor> grads;
  for (const Spec& s : kGradSpecs) {
    grads.push_back(random_tensor({s.numel}, s.dtype, rng, static_cast<float>(-2.0 * scale),
                                  static_cast<float>(2.0 * scale)));
  }
  return grads;
}

std::vector<Tensor> clones(const std::vector<Tensor>& ts) {
  std::vector<Tensor> out;
  for (const Tensor& t : ts) out.push_back(t.clone());
  return out;
}

std::vector<Tensor> to_gpu(const std::vector<Tensor>& ts) {
  std::vector<Tensor> out;
  for (const Tensor& t : ts) out.push_back(t.to(gpu()));
  return out;
}

// One parameter's fused step over elements [1, n] of its buffers, which start one float
// past a 16-byte boundary: the kernel must fall back to element-wise loads. The table goes
// through device memory as the backend's own upload does.
template <class Source, class Launch>
void step_one_past_alignment(const Source& source, Launch launch) {
  const kernels::ParamStepTable table = kernels::make_param_step_table("test", {source});
  Tensor device_table = Tensor::empty({static_cast<int64_t>(table.bytes.size() / 4) + 1},
                                      DType::I32, gpu());
  gpu_backend().copy_from_host(device_table.data(), table.bytes.data(), table.bytes.size());
  launch(table, device_table.data(), nullptr, nullptr, cuda_backend().stream());
}

template <class T>
T* one_past(const Tensor& t) {
  return static_cast<T*>(const_cast<void*>(t.data())) + 1;
}

// Writes the raw bits `bits` into element `index` of a host tensor.
void set_bits(Tensor& t, int64_t index, uint32_t bits) {
  std::memcpy(static_cast<unsigned char*>(t.data()) + index * dtype_size(t.dtype()), &bits,
              dtype_size(t.dtype()));
}

struct UnscaleRun {
  std::vector<Tensor> grads;
  Tensor found_inf;
  Tensor flags;
  uint64_t host_syncs = 0;  // during the call
};

UnscaleRun run_unscale(Backend& backend, const std::vector<Tensor>& inputs, double inv_scale,
                       float found_before) {
  UnscaleRun run;
  const Device device = backend.device();
  run.grads = device.is_cpu() ? clones(inputs) : to_gpu(inputs);
  run.found_inf = Tensor::full({1}, found_before, DType::F32, device);
  run.flags = Tensor::empty({static_cast<int64_t>(inputs.size())}, DType::I32, device);
  poison(run.flags);
  const uint64_t syncs = cuda_host_syncs();
  backend.unscale_and_check(run.grads, inv_scale, run.found_inf, run.flags);
  run.host_syncs = cuda_host_syncs() - syncs;
  return run;
}

}  // namespace

TEST_CASE("cuda unscale_and_check matches the CPU bit for bit, without a host sync", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(41);
  // A power-of-two scale restores values exactly; any other scale rounds once, through the
  // same round-to-odd narrowing on both backends.
  for (double scale : {1024.0, 3000.0}) {
    INFO("scale " << scale);
    const std::vector<Tensor> grads = scaled_grads(rng, scale);
    const UnscaleRun cpu = run_unscale(cpu_backend(), grads, 1.0 / scale, 0.0f);
    const UnscaleRun gpu_run = run_unscale(gpu_backend(), grads, 1.0 / scale, 0.0f);
    CHECK(gpu_run.host_syncs == 0);
    for (size_t i = 0; i < grads.size(); ++i) {
      INFO("gradient " << i);
      expect_bits_equal(cpu.grads[i], gpu_run.grads[i]);
    }
    expect_bits_equal(cpu.flags, gpu_run.flags);
    CHECK(gpu_run.flags.to_int_vector() == std::vector<int32_t>(grads.size(), 0));
    CHECK(gpu_run.found_inf.item() == 0.0);
  }
}

TEST_CASE("cuda unscale_and_check flags the tensors that hold Inf or NaN", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(42);
  std::vector<Tensor> grads = scaled_grads(rng, 1024.0);
  grads[2].set(3, std::numeric_limits<double>::infinity());  // BF16 [7], in the scalar tail
  grads[4].set(65537, std::nan(""));                           // F16, in its second chunk
  const UnscaleRun cpu = run_unscale(cpu_backend(), grads, 1.0 / 1024.0, 0.0f);
  const UnscaleRun gpu_run = run_unscale(gpu_backend(), grads, 1.0 / 1024.0, 0.0f);
  CHECK(gpu_run.host_syncs == 0);
  const std::vector<int32_t> expected_flags = {0, 0, 1, 0, 1, 0, 0};
  CHECK(gpu_run.flags.to_int_vector() == expected_flags);
  CHECK(cpu.flags.to_int_vector() == expected_flags);
  CHECK(gpu_run.found_inf.item() == 1.0);
  // Finite values are unscaled exactly as on the CPU; the NaN stays a NaN (its payload may
  // differ) and the infinity an infinity.
  for (size_t i = 0; i < grads.size(); ++i) {
    INFO("gradient " << i);
    expect_close(cpu.grads[i], gpu_run.grads[i], Tolerance{0.0, 0.0});
  }
  CHECK(std::isinf(gpu_run.grads[2].get(3)));
  CHECK(std::isnan(gpu_run.grads[4].get(65537)));
}

TEST_CASE("cuda unscale_and_check with inv_scale 1 only checks, leaving every bit", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(43);
  std::vector<Tensor> grads = scaled_grads(rng, 1.0);
  set_bits(grads[0], 5, 0x7FA00001u);   // a signalling NaN with a payload
  set_bits(grads[6], 131074, 0xFF800000u);  // -Inf in the last chunk's tail
  const UnscaleRun gpu_run = run_unscale(gpu_backend(), grads, 1.0, 0.0f);
  for (size_t i = 0; i < grads.size(); ++i) {
    INFO("gradient " << i);
    expect_bits_equal(grads[i], gpu_run.grads[i]);
  }
  CHECK(gpu_run.flags.to_int_vector() == std::vector<int32_t>{1, 0, 0, 0, 0, 0, 1});
  CHECK(gpu_run.found_inf.item() == 1.0);
}

TEST_CASE("cuda unscale_and_check never clears found_inf", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(44);
  const std::vector<Tensor> grads = scaled_grads(rng, 256.0);
  const UnscaleRun gpu_run = run_unscale(gpu_backend(), grads, 1.0 / 256.0, 1.0f);
  CHECK(gpu_run.found_inf.item() == 1.0);
  CHECK(gpu_run.flags.to_int_vector() == std::vector<int32_t>(grads.size(), 0));

  // No gradients: nothing to do, the flag kept.
  Tensor found = Tensor::full({1}, 0.0, DType::F32, gpu());
  Tensor flags = Tensor::empty({0}, DType::I32, gpu());
  gpu_backend().unscale_and_check({}, 0.5, found, flags);
  CHECK(found.item() == 0.0);
}

TEST_CASE("cuda squared_norms matches the CPU and repeats its bits", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(45);
  std::vector<Tensor> xs;
  for (const Spec& s : kGradSpecs) xs.push_back(random_tensor({s.numel}, s.dtype, rng));
  const int64_t count = static_cast<int64_t>(xs.size());
  Tensor expected = Tensor::empty({count}, DType::F32);
  cpu_backend().squared_norms(xs, expected);
  const std::vector<Tensor> device_xs = to_gpu(xs);
  Tensor actual = poisoned({count}, DType::F32);
  const uint64_t syncs = cuda_host_syncs();
  gpu_backend().squared_norms(device_xs, actual);
  CHECK(cuda_host_syncs() == syncs);
  // Sums of squares are positive, so a relative tolerance covers the different order; the
  // empty tensor's norm must be exactly 0.
  expect_close(expected, actual, Tolerance{1e-5, 0.0});
  CHECK(actual.get(5) == 0.0);

  Tensor again = poisoned({count}, DType::F32);
  gpu_backend().squared_norms(device_xs, again);
  expect_bits_equal(actual, again);

  // The same values one element past an aligned address (scalar loads) are summed in the
  // same order: the same bits.
  CudaBackend& backend = cuda_backend();
  std::vector<Tensor> shifted_storage;
  std::vector<kernels::TensorRef> refs;
  for (const Tensor& x : xs) {
    Tensor padded = Tensor::empty({x.numel() + 1}, x.dtype());
    if (x.nbytes() > 0)  // an empty tensor has no data pointer to copy from
      std::memcpy(static_cast<unsigned char*>(padded.data()) + dtype_size(x.dtype()), x.data(),
                  x.nbytes());
    shifted_storage.push_back(padded.to(gpu()));
    refs.push_back({static_cast<unsigned char*>(shifted_storage.back().data()) + dtype_size(x.dtype()),
                    x.numel(), x.dtype()});
  }
  const kernels::MultiTensorTable table = kernels::make_multi_tensor_table("test", refs);
  void* device_table = backend.allocate(table.bytes.size());
  backend.copy_from_host(device_table, table.bytes.data(), table.bytes.size());
  Tensor partials = Tensor::empty({table.chunks}, DType::F32, gpu());
  Tensor shifted = poisoned({count}, DType::F32);
  kernels::squared_norms(table, device_table, static_cast<float*>(partials.data()),
                         static_cast<float*>(shifted.data()), backend.stream());
  expect_bits_equal(actual, shifted);
  backend.deallocate(device_table, table.bytes.size());
}

namespace {

struct SgdCase {
  const char* name;
  SgdHyper hyper;
};

std::vector<SgdCase> sgd_cases() {
  SgdHyper plain;
  plain.lr = 0.1f;
  SgdHyper first;
  first.lr = 0.05f;
  first.momentum = 0.9f;
  first.dampening = 0.1f;
  first.weight_decay = 1e-2f;
  first.first_step = true;
  SgdHyper nesterov;
  nesterov.lr = 0.02f;
  nesterov.momentum = 0.8f;
  nesterov.weight_decay = 5e-3f;
  nesterov.nesterov = true;
  return {{"plain", plain}, {"momentum, first step", first}, {"nesterov", nesterov}};
}

// Working-copy dtypes: none, the two 16-bit ones, and a distinct F32 copy.
const std::vector<std::pair<bool, DType>> kWorking = {
    {false, DType::F32}, {true, DType::F16}, {true, DType::BF16}, {true, DType::F32}};

}  // namespace

TEST_CASE("cuda sgd_step matches the CPU and refreshes the working copy in the same pass", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(46);
  for (const SgdCase& c : sgd_cases()) {
    const bool has_momentum = c.hyper.momentum != 0.0f;
    for (const auto& [has_working, working_dtype] : kWorking) {
      for (int64_t n : kOddSizes) {
        INFO(c.name << ", working " << (has_working ? std::string(dtype_name(working_dtype)) : "none")
                    << " [" << n << "]");
        const Tensor master = random_tensor({n}, DType::F32, rng, -1.0f, 1.0f);
        const Tensor grad = random_tensor({n}, DType::F32, rng, -1.0f, 1.0f);
        const Tensor momentum = random_tensor({n}, DType::F32, rng, -0.5f, 0.5f);

        Tensor cpu_master = master.clone(), cpu_momentum = momentum.clone();
        Tensor cpu_working = Tensor::empty({n}, working_dtype);
        sgd_step_on(cpu_backend(), c.hyper, cpu_master, grad,
                    has_momentum ? &cpu_momentum : nullptr, has_working ? &cpu_working : nullptr,
                    nullptr);

        Tensor gpu_master = master.to(gpu()), gpu_momentum = momentum.to(gpu());
        Tensor gpu_working = poisoned({n}, working_dtype);
        Tensor found_inf = Tensor::zeros({1}, DType::F32, gpu());
        const uint64_t syncs = cuda_host_syncs();
        sgd_step_on(gpu_backend(), c.hyper, gpu_master, grad.to(gpu()),
                    has_momentum ? &gpu_momentum : nullptr, has_working ? &gpu_working : nullptr,
                    &found_inf);
        CHECK(cuda_host_syncs() == syncs);
        expect_close(cpu_master, gpu_master);
        expect_close(cpu_momentum, gpu_momentum);
        if (has_working) {
          // The working copy is exactly the new master rounded once.
          Tensor rounded = Tensor::empty({n}, working_dtype);
          cpu_backend().cast(gpu_master.to(kCPU), rounded);
          expect_bits_equal(rounded, gpu_working);
        }
      }
    }
  }
}

TEST_CASE("cuda sgd_step with found_inf set leaves every buffer bit-identical", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(47);
  const SgdCase c = sgd_cases()[1];
  for (DType working_dtype : kFloatingTypes) {
    for (int64_t n : kOddSizes) {
      INFO(dtype_name(working_dtype) << " [" << n << "]");
      const Tensor master = random_tensor({n}, DType::F32, rng);
      const Tensor momentum = random_tensor({n}, DType::F32, rng);
      const Tensor working = master.to(working_dtype);
      Tensor gpu_master = master.to(gpu()), gpu_momentum = momentum.to(gpu());
      Tensor gpu_working = working.to(gpu());
      // The flag as unscale_and_check leaves it: written on the device, never read here.
      Tensor found_inf = Tensor::full({1}, 1.0, DType::F32, gpu());
      const uint64_t syncs = cuda_host_syncs();
      sgd_step_on(gpu_backend(), c.hyper, gpu_master, random_tensor({n}, DType::F32, rng).to(gpu()),
                  &gpu_momentum, &gpu_working, &found_inf);
      CHECK(cuda_host_syncs() == syncs);
      expect_bits_equal(master, gpu_master);
      expect_bits_equal(momentum, gpu_momentum);
      expect_bits_equal(working, gpu_working);
    }
  }
}

TEST_CASE("cuda overflow in one gradient skips the step end to end on the device", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(48);
  const int64_t n = 1023;
  const Tensor master = random_tensor({n}, DType::F32, rng);
  Tensor gpu_master = master.to(gpu());
  Tensor scaled = random_tensor({n}, DType::F32, rng, -100.0f, 100.0f);
  scaled.set(700, std::numeric_limits<double>::infinity());
  std::vector<Tensor> grads = {random_tensor({5}, DType::F32, rng).to(gpu()), scaled.to(gpu())};
  Tensor found_inf = Tensor::zeros({1}, DType::F32, gpu());
  Tensor flags = Tensor::empty({2}, DType::I32, gpu());
  SgdHyper hyper;
  hyper.lr = 0.5f;
  const uint64_t syncs = cuda_host_syncs();
  gpu_backend().unscale_and_check(grads, 1.0 / 128.0, found_inf, flags);
  sgd_step_on(gpu_backend(), hyper, gpu_master, grads[1], nullptr, nullptr, &found_inf);
  CHECK(cuda_host_syncs() == syncs);
  CHECK(flags.to_int_vector() == std::vector<int32_t>{0, 1});
  expect_bits_equal(master, gpu_master);
}

TEST_CASE("cuda sgd_steps kernel handles misaligned buffers with scalar loads", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(49);
  const SgdHyper hyper = sgd_cases()[2].hyper;
  for (int64_t n : kOddSizes) {
    INFO("[" << n << "]");
    const Tensor master = random_tensor({n + 1}, DType::F32, rng);
    const Tensor grad = random_tensor({n + 1}, DType::F32, rng);
    const Tensor momentum = random_tensor({n + 1}, DType::F32, rng);
    Tensor cpu_master = master.clone(), cpu_momentum = momentum.clone();
    Tensor cpu_working = Tensor::empty({n + 1}, DType::F16);
    sgd_step_on(cpu_backend(), hyper, cpu_master, grad, &cpu_momentum, &cpu_working, nullptr);

    Tensor gpu_master = master.to(gpu()), gpu_momentum = momentum.to(gpu());
    const Tensor gpu_grad = grad.to(gpu());
    Tensor gpu_working = poisoned({n + 1}, DType::F16);
    const SgdStepRates rates = rates_of(hyper);
    kernels::SgdStepSource source{hyper, &rates, 1, {}};
    source.buffers = {one_past<float>(gpu_master), one_past<const float>(gpu_grad),
                      one_past<float>(gpu_momentum), nullptr, one_past<mixprec::half>(gpu_working),
                      static_cast<int32_t>(DType::F16), n};
    step_one_past_alignment(source, &kernels::sgd_steps);
    // Elements 1..n of each buffer against the CPU's within `rtol`; element 0 lies outside
    // the range and must keep what it held.
    const auto check_range = [n](const char* name, const Tensor& expected, const Tensor& actual,
                                 double rtol) {
      INFO(name);
      const std::vector<float> e = expected.to_float_vector(), a = actual.to_float_vector();
      for (int64_t i = 1; i <= n; ++i) {
        INFO("element " << i);
        const auto k = static_cast<size_t>(i);
        CHECK(std::fabs(a[k] - e[k]) <= rtol * (1.0 + std::fabs(e[k])));
      }
    };
    check_range("master", cpu_master, gpu_master, 1e-5);
    check_range("momentum", cpu_momentum, gpu_momentum, 1e-5);
    // The working copy rounds the master, which may differ from the CPU's by an FP32 ulp.
    check_range("working", cpu_working, gpu_working, 1e-3);
    CHECK(gpu_master.to_float_vector()[0] == master.to_float_vector()[0]);
    CHECK(gpu_momentum.to_float_vector()[0] == momentum.to_float_vector()[0]);
    CHECK(element_bits(gpu_working)[0] == poison_bits(DType::F16));
  }
}

namespace {

struct AdamCase {
  const char* name;
  AdamHyper hyper;
};

std::vector<AdamCase> adam_cases() {
  AdamHyper adam;
  adam.lr = 1e-3f;
  AdamHyper l2 = adam;
  l2.weight_decay = 0.1f;
  AdamHyper adamw = adam;
  adamw.weight_decay = 0.1f;
  adamw.decoupled_weight_decay = true;
  adamw.beta2 = 0.99f;
  adamw.eps = 1e-6f;
  return {{"Adam", adam}, {"Adam with L2", l2}, {"AdamW", adamw}};
}

// Non-negative values: a valid second moment.
Tensor random_second_moment(int64_t n, std::mt19937& rng) {
  return random_tensor({n}, DType::F32, rng, 0.0f, 0.01f);
}

std::vector<uint8_t> state_bytes(const Tensor& state) {
  const Tensor host = state.to(kCPU);
  const auto* p = static_cast<const uint8_t*>(host.data());
  return std::vector<uint8_t>(p, p + host.nbytes());
}

Tensor state_tensor(const DynamicScaleState& s, Device device) {
  Tensor host = Tensor::empty({kDynamicScaleStateWords}, DType::I32);
  std::memcpy(host.data(), &s, sizeof s);
  return host.to(device);
}

DynamicScaleState read_state(const Tensor& state) {
  const Tensor host = state.to(kCPU);
  DynamicScaleState s;
  std::memcpy(&s, host.data(), sizeof s);
  return s;
}

}  // namespace

TEST_CASE("cuda adam_step matches the CPU over several steps, working copy in the same pass",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(50);
  constexpr int64_t kSteps = 3;
  for (const AdamCase& c : adam_cases()) {
    for (const auto& [has_working, working_dtype] : kWorking) {
      for (int64_t n : kOddSizes) {
        INFO(c.name << ", working "
                    << (has_working ? std::string(dtype_name(working_dtype)) : "none") << " ["
                    << n << "]");
        const Tensor master = random_tensor({n}, DType::F32, rng, -1.0f, 1.0f);
        Tensor cpu_master = master.clone();
        Tensor cpu_avg = Tensor::zeros({n}), cpu_avg_sq = Tensor::zeros({n});
        Tensor cpu_working = Tensor::empty({n}, working_dtype);
        Tensor gpu_master = master.to(gpu());
        Tensor gpu_avg = Tensor::zeros({n}, DType::F32, gpu());
        Tensor gpu_avg_sq = Tensor::zeros({n}, DType::F32, gpu());
        Tensor gpu_working = poisoned({n}, working_dtype);
        const Tensor found_inf = Tensor::zeros({1}, DType::F32, gpu());

        AdamHyper hyper = c.hyper;
        for (int64_t t = 1; t <= kSteps; ++t) {
          hyper.set_step(t);
          const Tensor grad = random_tensor({n}, DType::F32, rng, -1.0f, 1.0f);
          const Tensor gpu_grad = grad.to(gpu());
          adam_step_on(cpu_backend(), hyper, cpu_master, grad, cpu_avg, cpu_avg_sq,
                       has_working ? &cpu_working : nullptr, nullptr);
          const uint64_t syncs = cuda_host_syncs();
          adam_step_on(gpu_backend(), hyper, gpu_master, gpu_grad, gpu_avg, gpu_avg_sq,
                       has_working ? &gpu_working : nullptr, &found_inf);
          CHECK(cuda_host_syncs() == syncs);
        }
        // nvcc fuses multiply-adds where the host compiler does not: the master within a
        // few FP32 roundings of itself plus a small fraction of lr, m within roundings of
        // the O(1) gradients it blends, v (a sum of positive terms) relative.
        expect_close(cpu_master, gpu_master, Tolerance{1e-6, 1e-7});
        expect_close(cpu_avg, gpu_avg, Tolerance{1e-6, 2e-6});
        expect_close(cpu_avg_sq, gpu_avg_sq, Tolerance{1e-6, 1e-8});
        if (has_working) {
          // The working copy is exactly the new GPU master rounded once.
          Tensor rounded = Tensor::empty({n}, working_dtype);
          cpu_backend().cast(gpu_master.to(kCPU), rounded);
          expect_bits_equal(rounded, gpu_working);
        }
      }
    }
  }
}

TEST_CASE("cuda adam_step with found_inf set leaves every buffer bit-identical", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(51);
  AdamHyper hyper = adam_cases()[2].hyper;
  hyper.set_step(5);
  for (double flag : {1.0, std::nan("")}) {
    for (DType working_dtype : kFloatingTypes) {
      for (int64_t n : kOddSizes) {
        INFO("flag " << flag << ", " << dtype_name(working_dtype) << " [" << n << "]");
        const Tensor master = random_tensor({n}, DType::F32, rng);
        const Tensor exp_avg = random_tensor({n}, DType::F32, rng, -0.1f, 0.1f);
        const Tensor exp_avg_sq = random_second_moment(n, rng);
        const Tensor working = master.to(working_dtype);
        Tensor gpu_master = master.to(gpu()), gpu_avg = exp_avg.to(gpu());
        Tensor gpu_avg_sq = exp_avg_sq.to(gpu()), gpu_working = working.to(gpu());
        const Tensor gpu_grad = random_tensor({n}, DType::F32, rng).to(gpu());
        // The flag as unscale_and_check leaves it: written on the device, never read here.
        const Tensor found_inf = Tensor::full({1}, flag, DType::F32, gpu());
        const uint64_t syncs = cuda_host_syncs();
        adam_step_on(gpu_backend(), hyper, gpu_master, gpu_grad, gpu_avg, gpu_avg_sq, &gpu_working,
                     &found_inf);
        CHECK(cuda_host_syncs() == syncs);
        expect_bits_equal(master, gpu_master);
        expect_bits_equal(exp_avg, gpu_avg);
        expect_bits_equal(exp_avg_sq, gpu_avg_sq);
        expect_bits_equal(working, gpu_working);
      }
    }
  }
}

TEST_CASE("cuda adam_steps kernel handles misaligned buffers with scalar loads", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(52);
  AdamHyper hyper = adam_cases()[1].hyper;
  hyper.set_step(2);
  for (int64_t n : kOddSizes) {
    INFO("[" << n << "]");
    const Tensor master = random_tensor({n + 1}, DType::F32, rng);
    const Tensor grad = random_tensor({n + 1}, DType::F32, rng);
    const Tensor exp_avg = random_tensor({n + 1}, DType::F32, rng, -0.1f, 0.1f);
    const Tensor exp_avg_sq = random_second_moment(n + 1, rng);
    Tensor cpu_master = master.clone(), cpu_avg = exp_avg.clone(), cpu_avg_sq = exp_avg_sq.clone();
    Tensor cpu_working = Tensor::empty({n + 1}, DType::BF16);
    adam_step_on(cpu_backend(), hyper, cpu_master, grad, cpu_avg, cpu_avg_sq, &cpu_working,
                 nullptr);

    Tensor gpu_master = master.to(gpu()), gpu_avg = exp_avg.to(gpu());
    Tensor gpu_avg_sq = exp_avg_sq.to(gpu());
    const Tensor gpu_grad = grad.to(gpu());
    Tensor gpu_working = poisoned({n + 1}, DType::BF16);
    const AdamStepRates rates = rates_of(hyper);
    kernels::AdamStepSource source{hyper, &rates, 1, {}};
    source.buffers = {one_past<float>(gpu_master), one_past<const float>(gpu_grad),
                      one_past<float>(gpu_avg), one_past<float>(gpu_avg_sq),
                      one_past<mixprec::bfloat16>(gpu_working), static_cast<int32_t>(DType::BF16),
                      n};
    step_one_past_alignment(source, &kernels::adam_steps);
    const std::vector<float> e = cpu_master.to_float_vector(), a = gpu_master.to_float_vector();
    const std::vector<float> ev = cpu_avg_sq.to_float_vector(), av = gpu_avg_sq.to_float_vector();
    CHECK(a[0] == master.to_float_vector()[0]);  // outside the range: untouched
    CHECK(av[0] == exp_avg_sq.to_float_vector()[0]);
    int64_t wrong = 0;
    for (size_t i = 1; i <= static_cast<size_t>(n); ++i) {
      wrong += std::fabs(a[i] - e[i]) <= 1e-6 * std::fabs(e[i]) + 1e-7 ? 0 : 1;
      wrong += std::fabs(av[i] - ev[i]) <= 1e-6 * ev[i] + 1e-8 ? 0 : 1;
    }
    CHECK(wrong == 0);
    const std::vector<uint32_t> bits = element_bits(gpu_working);
    CHECK(bits[0] == poison_bits(DType::BF16));
    Tensor rounded = Tensor::empty({n + 1}, DType::BF16);
    cpu_backend().cast(gpu_master.to(kCPU), rounded);
    const std::vector<uint32_t> expected = element_bits(rounded);
    CHECK(std::equal(bits.begin() + 1, bits.end(), expected.begin() + 1));
  }
}

TEST_CASE("cuda update_loss_scale follows the CPU's trajectory with no host sync", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  // Growth to the ceiling, overflows down to the floor and beyond, then a random mix with
  // NaN and infinite flags among the overflows.
  std::vector<double> flags(10, 0.0);
  flags.insert(flags.end(), 24, 1.0);
  std::mt19937 rng(53);
  std::uniform_int_distribution<int> pick(0, 9);
  for (int i = 0; i < 200; ++i) {
    const int r = pick(rng);
    const double inf = std::numeric_limits<double>::infinity();
    flags.push_back(r < 6 ? 0.0 : r < 8 ? 1.0 : r < 9 ? std::nan("") : inf);
  }

  for (HysteresisMode mode : {HysteresisMode::ResetOnGrowth, HysteresisMode::Consecutive}) {
    INFO("hysteresis mode " << static_cast<int>(mode));
    DynamicScaleRule rule;
    rule.growth_interval = 3;
    rule.hysteresis = 2;
    rule.hysteresis_mode = mode;
    rule.min_scale = 1.0;
    rule.max_scale = 1024.0;
    const DynamicScaleState initial{256.0, 0, rule.hysteresis};

    // The flags and snapshot buffers exist before the measured run.
    std::vector<Tensor> device_flags, snapshots;
    for (double f : flags) {
      device_flags.push_back(Tensor::full({1}, f, DType::F32, gpu()));
      snapshots.push_back(Tensor::empty({kDynamicScaleStateWords}, DType::I32, gpu()));
    }
    Tensor device_state = state_tensor(initial, gpu());
    const uint64_t syncs = cuda_host_syncs();
    for (size_t i = 0; i < flags.size(); ++i) {
      gpu_backend().update_loss_scale(rule, device_state, device_flags[i]);
      gpu_backend().copy(device_state, snapshots[i]);
    }
    CHECK(cuda_host_syncs() == syncs);

    Tensor host_state = state_tensor(initial, kCPU);
    bool reached_floor = false, reached_ceiling = false;
    int64_t mismatches = 0;
    for (size_t i = 0; i < flags.size(); ++i) {
      cpu_backend().update_loss_scale(rule, host_state, Tensor::full({1}, flags[i]));
      mismatches += state_bytes(snapshots[i]) == state_bytes(host_state) ? 0 : 1;
      const double scale = read_state(host_state).scale;
      reached_floor = reached_floor || scale == rule.min_scale;
      reached_ceiling = reached_ceiling || scale == rule.max_scale;
    }
    CHECK(mismatches == 0);
    CHECK(reached_floor);
    CHECK(reached_ceiling);
  }
}

TEST_CASE("cuda overflow skips Adam and backs the scale off, all on the device", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(54);
  const int64_t n = 1023;
  const Tensor master = random_tensor({n}, DType::F32, rng);
  Tensor gpu_master = master.to(gpu());
  Tensor gpu_avg = Tensor::zeros({n}, DType::F32, gpu());
  Tensor gpu_avg_sq = Tensor::zeros({n}, DType::F32, gpu());
  Tensor gpu_working = master.to(DType::F16).to(gpu());
  Tensor scaled = random_tensor({n}, DType::F32, rng, -100.0f, 100.0f);
  scaled.set(511, std::nan(""));
  std::vector<Tensor> grads = {random_tensor({5}, DType::F32, rng).to(gpu()), scaled.to(gpu())};
  Tensor found_inf = Tensor::zeros({1}, DType::F32, gpu());
  Tensor flags = Tensor::empty({2}, DType::I32, gpu());
  DynamicScaleRule rule;  // PyTorch's: back off by half on every overflow
  Tensor state = state_tensor(DynamicScaleState{65536.0, 7, 1}, gpu());
  AdamHyper hyper;
  hyper.set_step(1);

  const uint64_t syncs = cuda_host_syncs();
  gpu_backend().unscale_and_check(grads, 1.0 / 65536.0, found_inf, flags);
  adam_step_on(gpu_backend(), hyper, gpu_master, grads[1], gpu_avg, gpu_avg_sq, &gpu_working,
               &found_inf);
  gpu_backend().update_loss_scale(rule, state, found_inf);
  CHECK(cuda_host_syncs() == syncs);

  CHECK(flags.to_int_vector() == std::vector<int32_t>{0, 1});
  expect_bits_equal(master, gpu_master);
  expect_bits_equal(master.to(DType::F16), gpu_working);
  CHECK(gpu_avg.to_float_vector() == std::vector<float>(static_cast<size_t>(n), 0.0f));
  const DynamicScaleState after = read_state(state);
  CHECK(after.scale == 32768.0);
  CHECK(after.growth_tracker == 0);

  // The state must live on the backend's device.
  Tensor host_state = state_tensor(DynamicScaleState{}, kCPU);
  CHECK_THROWS_WITH(gpu_backend().update_loss_scale(rule, host_state, found_inf),
                    Catch::Contains("update_loss_scale"));
}
