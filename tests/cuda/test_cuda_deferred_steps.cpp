// The deferred-step primitives of the CUDA backend against the CPU backend: the loss-scale
// factor and the unscale by a scale read on the device, the clip by the total norm, the
// optimizer steps that pick their table entry from a device counter, and the counter. None
// of them may wait for the device: a whole step of them runs without a host sync.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "backend_agreement.h"
#include "cuda/cuda_backend.h"
#include "cuda/kernels/amp.h"
#include "tests/param_step_calls.h"

namespace {

using mixprec_test::adam_step_deferred_on;
using mixprec_test::adam_step_on;
using mixprec_test::sgd_step_deferred_on;
using mixprec_test::sgd_step_on;

using namespace mixprec;
using namespace mixprec::cuda_test;

constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor scale_state(double scale, Device device) {
  const DynamicScaleState s{scale, 0, 1};
  Tensor host = Tensor::empty({kDynamicScaleStateWords}, DType::I32);
  std::memcpy(host.data(), &s, sizeof s);
  return host.to(device);
}

// Per-step values for steps t0, t0 + 1, ... with a decaying learning rate, as the host fills
// them before it knows how many of the steps are taken.
AdamRateTable adam_table(const AdamHyper& base, int32_t count, int64_t t0) {
  AdamRateTable table;
  table.count = count;
  for (int32_t j = 0; j < count; ++j) {
    AdamHyper h = base;
    h.lr = 1e-3f * (1.0f - 0.05f * static_cast<float>(j));
    h.set_step(t0 + j);
    table.entry[j] = {h.lr, h.step_size, h.bias_correction2_sqrt, h.decay_factor, h.step};
  }
  return table;
}

SgdRateTable sgd_table(int32_t count, bool first) {
  SgdRateTable table;
  table.count = count;
  for (int32_t j = 0; j < count; ++j)
    table.entry[j] = {0.1f * (1.0f - 0.05f * static_cast<float>(j)), first && j == 0 ? 1 : 0};
  return table;
}

// Working-copy dtypes: none, the two 16-bit ones, and a distinct F32 copy.
const std::vector<std::pair<bool, DType>> kWorkingCopies = {
    {false, DType::F32}, {true, DType::F16}, {true, DType::BF16}, {true, DType::F32}};

}  // namespace

TEST_CASE("cuda loss_scale_factor and count_taken_step match the CPU on the device",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  for (double scale : {3.0, 65536.0, 3000.0, 12345.678}) {
    for (double weight : {1.0 / 3.0, 0.25, 0.1, 1.0 / 7.0}) {
      INFO("scale " << scale << ", weight " << weight);
      Tensor expected = Tensor::empty({1});
      cpu_backend().loss_scale_factor(scale_state(scale, kCPU), weight, expected);
      CHECK(expected.item() == static_cast<double>(static_cast<float>(scale * weight)));
      Tensor actual = poisoned({1}, DType::F32);
      const uint64_t syncs = cuda_host_syncs();
      gpu_backend().loss_scale_factor(scale_state(scale, gpu()), weight, actual);
      CHECK(cuda_host_syncs() == syncs);
      expect_bits_equal(expected, actual);
    }
  }

  const std::vector<double> flags = {0.0, 1.0, std::nan(""), 0.0, kInf, -0.0, 0.0, -2.0};
  std::vector<Tensor> device_flags, snapshots;
  for (double f : flags) {
    device_flags.push_back(Tensor::full({1}, f, DType::F32, gpu()));
    snapshots.push_back(poisoned({1}, DType::I32));
  }
  Tensor cpu_taken = taken_on(2, kCPU), gpu_taken = taken_on(2, gpu());
  const uint64_t syncs = cuda_host_syncs();
  for (size_t i = 0; i < flags.size(); ++i) {
    gpu_backend().count_taken_step(device_flags[i], gpu_taken);
    gpu_backend().copy(gpu_taken, snapshots[i]);
  }
  CHECK(cuda_host_syncs() == syncs);
  std::vector<int32_t> expected, actual;
  for (size_t i = 0; i < flags.size(); ++i) {
    cpu_backend().count_taken_step(Tensor::full({1}, flags[i]), cpu_taken);
    expected.push_back(cpu_taken.to_int_vector()[0]);
    actual.push_back(snapshots[i].to_int_vector()[0]);
  }
  CHECK(actual == expected);
  CHECK(expected == std::vector<int32_t>{3, 3, 3, 4, 4, 5, 6, 6});
}

TEST_CASE("cuda unscale_and_check_on_device matches the unscale by 1 / S", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(81);
  struct Spec {
    DType dtype;
    int64_t numel;
  };
  const std::vector<Spec> specs = {{DType::F32, 1023}, {DType::F16, 70000}, {DType::BF16, 7},
                                   {DType::BF16, 0},   {DType::F32, 2 * 65536 + 3}};
  for (bool inject : {false, true}) {
    // S = 1 is a pure check; 0.5 overflows the largest F16 values.
    for (double scale : {3000.0, 65536.0, 1.0, 0.5}) {
      INFO("scale " << scale << (inject ? ", with Inf and NaN" : ""));
      std::vector<Tensor> grads;
      for (const Spec& s : specs)
        grads.push_back(random_tensor({s.numel}, s.dtype, rng, -2.0f * 3000.0f, 2.0f * 3000.0f));
      grads[1].set(69999, 65504.0);
      if (inject) {
        grads[2].set(3, kInf);
        grads[1].set(65537, std::nan(""));
      }
      const int64_t count = static_cast<int64_t>(grads.size());

      std::vector<Tensor> cpu_grads = copies_on(grads, kCPU);
      Tensor cpu_found = Tensor::zeros({1}), cpu_flags = Tensor::empty({count}, DType::I32);
      cpu_backend().unscale_and_check_on_device(cpu_grads, scale_state(scale, kCPU), cpu_found,
                                                cpu_flags);
      // The host-scale call on the device, for bit-exact NaN payloads.
      std::vector<Tensor> host_scale_grads = copies_on(grads, gpu());
      Tensor host_scale_found = Tensor::zeros({1}, DType::F32, gpu());
      Tensor host_scale_flags = poisoned({count}, DType::I32);
      gpu_backend().unscale_and_check(host_scale_grads, 1.0 / scale, host_scale_found,
                                      host_scale_flags);

      std::vector<Tensor> gpu_grads = copies_on(grads, gpu());
      Tensor gpu_found = Tensor::zeros({1}, DType::F32, gpu());
      Tensor gpu_flags = poisoned({count}, DType::I32);
      const Tensor state = scale_state(scale, gpu());
      const uint64_t syncs = cuda_host_syncs();
      gpu_backend().unscale_and_check_on_device(gpu_grads, state, gpu_found, gpu_flags);
      CHECK(cuda_host_syncs() == syncs);

      for (size_t i = 0; i < grads.size(); ++i) {
        INFO("gradient " << i);
        expect_bits_equal(host_scale_grads[i], gpu_grads[i]);
        if (inject) expect_close(cpu_grads[i], gpu_grads[i], Tolerance{0.0, 0.0});
        else expect_bits_equal(cpu_grads[i], gpu_grads[i]);
      }
      expect_bits_equal(cpu_flags, gpu_flags);
      expect_bits_equal(cpu_found, gpu_found);
      CHECK(gpu_flags.to_int_vector()[1] == (inject || scale < 1.0 ? 1 : 0));
    }
  }
}

TEST_CASE("cuda clip_by_total_norm matches the CPU bit for bit", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(82);
  const std::vector<int64_t> sizes = {1023, 7, 0, 2 * 65536 + 3, 1};
  std::vector<Tensor> grads;
  for (int64_t n : sizes) grads.push_back(random_tensor({n}, DType::F32, rng));
  const int64_t count = static_cast<int64_t>(grads.size());
  Tensor sums = Tensor::empty({count});
  cpu_backend().squared_norms(grads, sums);
  double total = 0.0;
  for (float s : sums.to_float_vector()) total += s;
  const double norm = std::sqrt(total);

  Tensor inf_sums = sums.clone(), nan_sums = sums.clone();
  inf_sums.set(3, kInf);
  nan_sums.set(0, std::nan(""));
  struct Case {
    const char* name;
    const Tensor* sums;
    double max_norm;
    bool clipped;
  };
  for (const Case& c : {Case{"clipped", &sums, 1.0, true}, Case{"not clipped", &sums, 2.0 * norm, false},
                        Case{"Inf norm", &inf_sums, 1.0, false},
                        Case{"NaN norm", &nan_sums, 1.0, false}}) {
    INFO(c.name);
    std::vector<Tensor> cpu_grads = copies_on(grads, kCPU);
    Tensor cpu_norm = Tensor::empty({1});
    cpu_backend().clip_by_total_norm(cpu_grads, *c.sums, c.max_norm, cpu_norm);

    std::vector<Tensor> gpu_grads = copies_on(grads, gpu());
    const Tensor gpu_sums = c.sums->to(gpu());
    Tensor gpu_norm = poisoned({1}, DType::F32);
    const uint64_t syncs = cuda_host_syncs();
    gpu_backend().clip_by_total_norm(gpu_grads, gpu_sums, c.max_norm, gpu_norm);
    CHECK(cuda_host_syncs() == syncs);
    expect_bits_equal(cpu_norm, gpu_norm);
    for (size_t i = 0; i < grads.size(); ++i) {
      INFO("gradient " << i);
      expect_bits_equal(cpu_grads[i], gpu_grads[i]);
      if (grads[i].numel() > 0) CHECK((element_bits(gpu_grads[i]) != element_bits(grads[i])) == c.clipped);
    }
  }

  // No gradients: the norm alone, 0.
  Tensor empty_norm = poisoned({1}, DType::F32);
  gpu_backend().clip_by_total_norm({}, Tensor::empty({0}, DType::F32, gpu()), 1.0, empty_norm);
  CHECK(element_bits(empty_norm)[0] == 0u);

  // One float past an aligned address: the scale pass's scalar loop gives the same bits.
  CudaBackend& backend = dynamic_cast<CudaBackend&>(gpu_backend());
  std::vector<Tensor> cpu_grads = copies_on(grads, kCPU);
  Tensor cpu_norm = Tensor::empty({1});
  cpu_backend().clip_by_total_norm(cpu_grads, sums, 1.0, cpu_norm);
  std::vector<Tensor> padded;
  std::vector<kernels::TensorRef> refs;
  for (const Tensor& g : grads) {
    Tensor p = Tensor::zeros({g.numel() + 1});
    if (g.numel() > 0) std::memcpy(p.data_as<float>() + 1, g.data(), g.nbytes());
    padded.push_back(p.to(gpu()));
    refs.push_back({padded.back().data_as<float>() + 1, g.numel(), DType::F32});
  }
  const kernels::MultiTensorTable table = kernels::make_multi_tensor_table("test", refs);
  void* device_table = backend.allocate(table.bytes.size());
  backend.copy_from_host(device_table, table.bytes.data(), table.bytes.size());
  const Tensor gpu_sums = sums.to(gpu());
  Tensor coef = Tensor::empty({2}, DType::F32, gpu());  // one double
  Tensor shifted_norm = poisoned({1}, DType::F32);
  kernels::clip_by_total_norm(table, device_table, gpu_sums.data_as<float>(), 1.0,
                              shifted_norm.data_as<float>(), static_cast<double*>(coef.data()),
                              backend.stream());
  expect_bits_equal(cpu_norm, shifted_norm);
  for (size_t i = 0; i < grads.size(); ++i) {
    INFO("gradient " << i << ", shifted");
    const std::vector<uint32_t> bits = element_bits(padded[i]);
    CHECK(bits[0] == 0u);  // before the range: untouched
    const std::vector<uint32_t> expected = element_bits(cpu_grads[i]);
    CHECK(std::vector<uint32_t>(bits.begin() + 1, bits.end()) == expected);
  }
  backend.deallocate(device_table, table.bytes.size());
}

TEST_CASE("cuda deferred optimizer steps match the CPU and the immediate step they stand for",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(83);
  AdamHyper adam_base;
  adam_base.weight_decay = 0.1f;
  adam_base.decoupled_weight_decay = true;
  adam_base.beta2 = 0.99f;
  const AdamRateTable adam = adam_table(adam_base, 4, 3);
  SgdHyper sgd_base;
  sgd_base.momentum = 0.9f;
  sgd_base.dampening = 0.1f;
  sgd_base.weight_decay = 1e-2f;
  const SgdRateTable sgd = sgd_table(4, true);

  for (const auto& [has_working, working_dtype] : kWorkingCopies) {
    for (int64_t n : kOddSizes) {
      for (int32_t j : {0, 3}) {
        INFO("working " << (has_working ? std::string(dtype_name(working_dtype)) : "none") << " ["
                        << n << "], taken " << j);
        const Tensor master = random_tensor({n}, DType::F32, rng);
        const Tensor grad = random_tensor({n}, DType::F32, rng);
        const Tensor exp_avg = random_tensor({n}, DType::F32, rng, -0.1f, 0.1f);
        const Tensor exp_avg_sq = random_tensor({n}, DType::F32, rng, 0.0f, 0.01f);
        const Tensor momentum = random_tensor({n}, DType::F32, rng, -0.5f, 0.5f);
        const Tensor gpu_grad = grad.to(gpu());
        const Tensor cpu_found = Tensor::zeros({1});
        const Tensor gpu_found = Tensor::zeros({1}, DType::F32, gpu());

        // Adam: CPU deferred, GPU deferred, GPU immediate with the entry's hyper.
        Tensor cm = master.clone(), ca = exp_avg.clone(), cv = exp_avg_sq.clone();
        Tensor cw = Tensor::empty({n}, working_dtype);
        adam_step_deferred_on(cpu_backend(), adam_base, adam, taken_on(j, kCPU), cm, grad, ca, cv,
                              has_working ? &cw : nullptr, cpu_found);
        Tensor gm = master.to(gpu()), ga = exp_avg.to(gpu()), gv = exp_avg_sq.to(gpu());
        Tensor gw = poisoned({n}, working_dtype);
        const Tensor gpu_taken = taken_on(j, gpu());
        uint64_t syncs = cuda_host_syncs();
        adam_step_deferred_on(gpu_backend(), adam_base, adam, gpu_taken, gm, gpu_grad, ga, gv,
                              has_working ? &gw : nullptr, gpu_found);
        CHECK(cuda_host_syncs() == syncs);
        AdamHyper hyper = adam_base;
        hyper.lr = adam.entry[j].lr;
        hyper.set_step(3 + j);
        Tensor im = master.to(gpu()), ia = exp_avg.to(gpu()), iv = exp_avg_sq.to(gpu());
        Tensor iw = poisoned({n}, working_dtype);
        adam_step_on(gpu_backend(), hyper, im, gpu_grad, ia, iv, has_working ? &iw : nullptr,
                     &gpu_found);
        expect_bits_equal(im, gm);
        expect_bits_equal(ia, ga);
        expect_bits_equal(iv, gv);
        if (has_working) expect_bits_equal(iw, gw);
        // As the immediate step's own agreement test: FP32 formulas within a few roundings.
        expect_close(cm, gm, Tolerance{1e-6, 1e-7});
        expect_close(ca, ga, Tolerance{1e-6, 2e-6});
        expect_close(cv, gv, Tolerance{1e-6, 1e-8});
        CHECK(element_bits(gm) != element_bits(master));

        // SGD, entry 0 being the first update.
        Tensor sm = master.clone(), sb = momentum.clone(), sw = Tensor::empty({n}, working_dtype);
        sgd_step_deferred_on(cpu_backend(), sgd_base, sgd, taken_on(j, kCPU), sm, grad, &sb,
                             has_working ? &sw : nullptr, cpu_found);
        Tensor tm = master.to(gpu()), tb = momentum.to(gpu());
        Tensor tw = poisoned({n}, working_dtype);
        syncs = cuda_host_syncs();
        sgd_step_deferred_on(gpu_backend(), sgd_base, sgd, gpu_taken, tm, gpu_grad, &tb,
                             has_working ? &tw : nullptr, gpu_found);
        CHECK(cuda_host_syncs() == syncs);
        SgdHyper sgd_hyper = sgd_base;
        sgd_hyper.lr = sgd.entry[j].lr;
        sgd_hyper.first_step = j == 0;
        Tensor jm = master.to(gpu()), jb = momentum.to(gpu());
        Tensor jw = poisoned({n}, working_dtype);
        sgd_step_on(gpu_backend(), sgd_hyper, jm, gpu_grad, &jb, has_working ? &jw : nullptr,
                    &gpu_found);
        expect_bits_equal(jm, tm);
        expect_bits_equal(jb, tb);
        if (has_working) expect_bits_equal(jw, tw);
        expect_close(sm, tm);
        expect_close(sb, tb);
      }
    }
  }
}

TEST_CASE("cuda deferred optimizer steps skip on found_inf or a count outside the table",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(84);
  AdamHyper adam_base;
  const AdamRateTable adam = adam_table(adam_base, 3, 1);
  SgdHyper sgd_base;
  sgd_base.momentum = 0.9f;
  const SgdRateTable sgd = sgd_table(3, false);
  const int64_t n = 1023;
  const Tensor master = random_tensor({n}, DType::F32, rng);
  const Tensor exp_avg = random_tensor({n}, DType::F32, rng, -0.1f, 0.1f);
  const Tensor exp_avg_sq = random_tensor({n}, DType::F32, rng, 0.0f, 0.01f);
  const Tensor momentum = random_tensor({n}, DType::F32, rng);
  const Tensor working = master.to(DType::BF16);
  const Tensor grad = random_tensor({n}, DType::F32, rng).to(gpu());
  Tensor gm = master.to(gpu()), ga = exp_avg.to(gpu()), gv = exp_avg_sq.to(gpu());
  Tensor gb = momentum.to(gpu()), gw = working.to(gpu()), sm = master.to(gpu()), sw = working.to(gpu());
  struct Skip {
    double flag;
    int32_t j;
  };
  const uint64_t syncs = cuda_host_syncs();
  for (const Skip& k : {Skip{1.0, 0}, Skip{std::nan(""), 1}, Skip{kInf, 2}, Skip{0.0, 3},
                        Skip{0.0, -1}, Skip{0.0, kMaxDeferredSteps}}) {
    const Tensor found = Tensor::full({1}, k.flag, DType::F32, gpu());
    const Tensor taken = taken_on(k.j, gpu());
    adam_step_deferred_on(gpu_backend(), adam_base, adam, taken, gm, grad, ga, gv, &gw, found);
    sgd_step_deferred_on(gpu_backend(), sgd_base, sgd, taken, sm, grad, &gb, &sw, found);
  }
  CHECK(cuda_host_syncs() == syncs);
  expect_bits_equal(master, gm);
  expect_bits_equal(exp_avg, ga);
  expect_bits_equal(exp_avg_sq, gv);
  expect_bits_equal(working, gw);
  expect_bits_equal(master, sm);
  expect_bits_equal(momentum, gb);
  expect_bits_equal(working, sw);

  // The table must be valid on this backend too, and every tensor on its device.
  AdamRateTable stale = adam;
  stale.entry[2].step_size *= 2.0f;
  const Tensor found = Tensor::zeros({1}, DType::F32, gpu());
  CHECK_THROWS_WITH(adam_step_deferred_on(gpu_backend(), adam_base, stale, taken_on(0, gpu()), gm,
                                          grad, ga, gv, &gw, found),
                    Catch::Contains("adam_step_deferred") && Catch::Contains("entry 2"));
  CHECK_THROWS_WITH(sgd_step_deferred_on(gpu_backend(), sgd_base, sgd, taken_on(0, kCPU), sm, grad,
                                         &gb, &sw, found),
                    Catch::Contains("sgd_steps") && Catch::Contains("taken"));
}

TEST_CASE("cuda a run of deferred steps needs no host sync and follows the CPU", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(85);
  // Two parameters, four steps queued before the host resolves any: the second step's
  // gradient overflows, so three are taken and the counter picks entries 0, 1, 1, 2.
  const std::vector<int64_t> sizes = {1023, 70000};
  const int steps = 4;
  std::vector<std::vector<Tensor>> step_grads;
  for (int s = 0; s < steps; ++s) {
    std::vector<Tensor> gs;
    for (int64_t n : sizes) gs.push_back(random_tensor({n}, DType::F32, rng, -3000.0f, 3000.0f));
    if (s == 1) gs[1].set(4321, std::nan(""));
    step_grads.push_back(gs);
  }
  std::vector<Tensor> masters;
  for (int64_t n : sizes) masters.push_back(random_tensor({n}, DType::F32, rng));
  AdamHyper base;
  const AdamRateTable table = adam_table(base, steps, 1);
  DynamicScaleRule rule;
  rule.growth_interval = 2;

  struct Run {
    std::vector<Tensor> master, exp_avg, exp_avg_sq, working;
    Tensor state, taken, factor, norm;
  };
  auto run = [&](Backend& backend) {
    const Device device = backend.device();
    Run r;
    for (const Tensor& m : masters) {
      r.master.push_back(device.is_cpu() ? m.clone() : m.to(device));
      r.exp_avg.push_back(Tensor::zeros(m.shape(), DType::F32, device));
      r.exp_avg_sq.push_back(Tensor::zeros(m.shape(), DType::F32, device));
      r.working.push_back(m.to(DType::F16).to(device));
    }
    r.state = scale_state(3000.0, device);
    r.taken = taken_on(0, device);
    r.factor = Tensor::empty({1}, DType::F32, device);
    r.norm = Tensor::empty({1}, DType::F32, device);
    std::vector<std::vector<Tensor>> grads;
    for (const auto& gs : step_grads) grads.push_back(copies_on(gs, device));
    const int64_t count = static_cast<int64_t>(sizes.size());
    Tensor found = Tensor::empty({1}, DType::F32, device);
    Tensor flags = Tensor::empty({count}, DType::I32, device);
    Tensor sums = Tensor::empty({count}, DType::F32, device);

    const uint64_t syncs = cuda_host_syncs();
    for (int s = 0; s < steps; ++s) {
      backend.loss_scale_factor(r.state, 0.5, r.factor);
      backend.fill(found, 0.0);
      backend.unscale_and_check_on_device(grads[s], r.state, found, flags);
      backend.squared_norms(grads[s], sums);
      backend.clip_by_total_norm(grads[s], sums, 1.0, r.norm);
      for (size_t p = 0; p < sizes.size(); ++p) {
        adam_step_deferred_on(backend, base, table, r.taken, r.master[p], grads[s][p], r.exp_avg[p],
                              r.exp_avg_sq[p], &r.working[p], found);
      }
      backend.count_taken_step(found, r.taken);
      backend.update_loss_scale(rule, r.state, found);
    }
    if (!device.is_cpu()) CHECK(cuda_host_syncs() == syncs);
    return r;
  };
  const Run expected = run(cpu_backend());
  const Run actual = run(gpu_backend());

  CHECK(expected.taken.to_int_vector() == std::vector<int32_t>{3});
  expect_bits_equal(expected.taken, actual.taken);
  expect_bits_equal(expected.state, actual.state);
  expect_bits_equal(expected.factor, actual.factor);
  // The last step's norm: from the GPU's squared_norms, whose order differs from the CPU's.
  expect_close(expected.norm, actual.norm, Tolerance{1e-5, 0.0});
  for (size_t p = 0; p < sizes.size(); ++p) {
    INFO("parameter " << p);
    expect_close(expected.master[p], actual.master[p], Tolerance{1e-5, 1e-6});
    expect_close(expected.exp_avg[p], actual.exp_avg[p], Tolerance{1e-4, 1e-6});
    CHECK(element_bits(actual.master[p]) != element_bits(masters[p]));
  }
}
