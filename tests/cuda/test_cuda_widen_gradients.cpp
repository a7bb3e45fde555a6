// The CUDA backend's widen_gradients against the CPU's, bit for bit (a widening is exact and
// the accumulation one F32 add): many tensors of both 16-bit dtypes in one launch, sizes on
// either side of the multi-tensor chunk, sources shared between items, misaligned pointers;
// and a backward on the GPU widening all of its 16-bit leaf gradients in that one launch.
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend_agreement.h"
#include "core/ops/ops.h"
#include "cuda/cuda_backend.h"
#include "cuda/kernels/amp.h"
#include "cuda_backend_access.h"
#include "tests/cuda/profiling_scope.h"

namespace {

using namespace mixprec;
using namespace mixprec::cuda_test;

// Launches in the profile of casts into F32: a gradient widened on its own.
int64_t widening_casts() {
  int64_t calls = 0;
  for (const KernelProfileRow& row : kernel_profile())
    if (row.kernel.rfind("cast_kernel", 0) == 0 && row.site.find("Dst = float") != std::string::npos)
      calls += row.calls;
  return calls;
}

struct Item {
  DType dtype;
  int64_t numel;
  bool accumulate;
};

}  // namespace

TEST_CASE("cuda widen_gradients matches the CPU bit for bit in one launch", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(23);
  const int64_t chunk = kernels::kMultiTensorChunk;
  const std::vector<Item> specs = {
      {DType::F16, 1, false},          {DType::BF16, 7, true},
      {DType::F16, chunk - 1, true},   {DType::BF16, chunk, false},
      {DType::F16, chunk + 1, false},  {DType::BF16, 2 * chunk + 3, true},
      {DType::F16, 0, true},           {DType::F16, 4097, false},
      {DType::BF16, 1023, false},      {DType::F16, 3 * chunk + 11, true}};
  std::vector<Tensor> sources, cpu_out, gpu_sources, gpu_out;
  for (const Item& s : specs) {
    sources.push_back(random_tensor({s.numel}, s.dtype, rng, -70000.0f, 70000.0f));
    const Tensor start = random_tensor({s.numel}, DType::F32, rng);
    cpu_out.push_back(start.clone());
    gpu_sources.push_back(sources.back().to(gpu()));
    // An overwritten destination is poisoned, so an element left unwritten shows.
    gpu_out.push_back(s.accumulate ? start.to(gpu()) : poisoned({s.numel}, DType::F32));
  }
  std::vector<GradientWidening> cpu_items, gpu_items;
  for (size_t k = 0; k < specs.size(); ++k) {
    cpu_items.push_back({&sources[k], &cpu_out[k], specs[k].accumulate});
    gpu_items.push_back({&gpu_sources[k], &gpu_out[k], specs[k].accumulate});
  }
  // The first source again, for an item of its own: one gradient handed to two leaves.
  Tensor extra_cpu = Tensor::empty({1}, DType::F32), extra_gpu = poisoned({1}, DType::F32);
  cpu_items.push_back({&sources[0], &extra_cpu, false});
  gpu_items.push_back({&gpu_sources[0], &extra_gpu, false});

  cpu_backend().widen_gradients(cpu_items);
  {
    ProfilingScope profile;
    gpu_backend().widen_gradients(gpu_items);
    INFO("one launch for every tensor");
    CHECK(launches_of("widen_kernel") == 1);
  }
  for (size_t k = 0; k < specs.size(); ++k) {
    INFO("item " << k << ": " << describe(sources[k])
                 << (specs[k].accumulate ? ", accumulated" : ", overwritten"));
    expect_bits_equal(cpu_out[k], gpu_out[k]);
  }
  expect_bits_equal(extra_cpu, extra_gpu);
}

TEST_CASE("cuda widen_gradients stores element by element where pointers are misaligned",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(29);
  for (int64_t n : kOddSizes) {
    for (bool accumulate : {false, true}) {
      INFO("[" << n << "], " << (accumulate ? "accumulated" : "overwritten"));
      // Element 1 onwards of each buffer: 2 bytes past 8-byte alignment for the source, 4
      // past 16 for the destination, so neither side can move packs.
      const Tensor source = random_tensor({n + 1}, DType::F16, rng);
      const Tensor start = random_tensor({n + 1}, DType::F32, rng);
      const Tensor gpu_source = source.to(gpu());
      Tensor gpu_destination = start.to(gpu());
      const kernels::MultiTensorTable table = kernels::make_multi_tensor_table(
          "test", {{static_cast<char*>(const_cast<void*>(gpu_source.data())) + 2, n,
                    DType::F16}});
      const kernels::WidenTarget target{gpu_destination.data_as<float>() + 1, accumulate ? 1 : 0};
      std::vector<unsigned char> block(kernels::widen_targets_offset(table) + sizeof target);
      std::memcpy(block.data(), table.bytes.data(), table.bytes.size());
      std::memcpy(block.data() + kernels::widen_targets_offset(table), &target, sizeof target);
      Tensor device_block =
          Tensor::empty({static_cast<int64_t>(block.size() / 4)}, DType::I32, gpu());
      gpu_backend().copy_from_host(device_block.data(), block.data(), block.size());
      kernels::widen_gradients(table, device_block.data(), cuda_backend().stream());

      const std::vector<float> s = source.to_float_vector(), e = start.to_float_vector();
      const std::vector<float> a = gpu_destination.to_float_vector();
      CHECK(a[0] == e[0]);  // outside the range: untouched
      int64_t wrong = 0;
      for (size_t i = 1; i <= static_cast<size_t>(n); ++i)
        wrong += a[i] == (accumulate ? e[i] + s[i] : s[i]) ? 0 : 1;
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("a backward on cuda widens its 16-bit leaf gradients in one launch", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(31);
  for (DType dtype : {DType::F16, DType::BF16}) {
    INFO(dtype);
    const Tensor w_host = random_tensor({6, 5}, dtype, rng);
    const Tensor b_host = random_tensor({5}, dtype, rng);
    const Tensor x_host = random_tensor({4, 6}, dtype, rng);
    std::vector<Tensor> grads[2];
    for (Device device : {kCPU, gpu()}) {
      Tensor w = w_host.to(device), b = b_host.to(device);
      for (Tensor* leaf : {&w, &b}) {
        leaf->set_requires_grad(true);
        leaf->set_grad_dtype(DType::F32);
      }
      const Tensor loss = ops::sum(ops::add(ops::matmul(x_host.to(device), w), b));
      ProfilingScope profile;
      loss.backward();
      if (device == gpu()) {
        CHECK(launches_of("widen_kernel") == 1);
        CHECK(widening_casts() == 0);
      }
      grads[device == kCPU ? 0 : 1] = {w.grad(), b.grad()};
    }
    for (size_t k = 0; k < 2; ++k) {
      REQUIRE(grads[1][k].dtype() == DType::F32);
      // The gradients are rounded to the 16-bit dtype before they are widened.
      expect_close(grads[0][k], grads[1][k], tolerance_for(dtype));
    }
  }
}
