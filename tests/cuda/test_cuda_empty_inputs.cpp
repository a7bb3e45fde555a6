// Primitives given an input with a zero extent, CUDA against the CPU backend: where the
// outputs are not empty themselves, what the CPU writes (zero gradients, a bias-only
// convolution, an empty loss) the GPU must write too. Outputs start poisoned on both
// backends, so an output the GPU leaves unwritten fails unless the CPU leaves it too.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "backend_agreement.h"
#include "core/ops/gemm_desc.h"

namespace mixprec::cuda_test {
namespace {

// Runs `call(backend, device)` on both backends and compares every output it returns, one
// after the other, bit for bit: with nothing to sum, no rounding can differ. The cases are
// chosen so that the CPU writes every element of them, which is checked too, so a poisoned
// element on both sides cannot pass for agreement.
template <class Call>
void check_both(const Call& call) {
  const std::vector<Tensor> expected = call(cpu_backend(), kCPU);
  const std::vector<Tensor> actual = call(gpu_backend(), gpu());
  REQUIRE(expected.size() == actual.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    INFO("output " << i);
    for (const uint32_t bits : element_bits(expected[i])) REQUIRE(bits != poison_bits(expected[i].dtype()));
    expect_bits_equal(expected[i], actual[i]);
  }
}

TEST_CASE("cuda layer_norm_backward over zero rows zeroes the parameter gradients", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(71);
  for (DType dtype : kFloatingTypes) {
    INFO(dtype);
    const Tensor weight = random_tensor({5}, dtype, rng);
    check_both([&](Backend& backend, Device device) {
      const Tensor x = Tensor::empty({0, 5}, dtype, device), dy = Tensor::empty({0, 5}, dtype, device);
      const Tensor mean = Tensor::empty({0}, DType::F32, device);
      const Tensor rstd = Tensor::empty({0}, DType::F32, device);
      Tensor dx = Tensor::empty({0, 5}, dtype, device);
      Tensor dweight = poisoned({5}, dtype, device), dbias = poisoned({5}, dtype, device);
      const Tensor w = weight.to(device);
      backend.layer_norm_backward(x, &w, mean, rstd, dy, dx, &dweight, &dbias);
      return std::vector<Tensor>{dweight, dbias};
    });
  }
}

TEST_CASE("cuda embedding_backward of no ids zeroes the table's gradient", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  for (DType dtype : kFloatingTypes) {
    INFO(dtype);
    check_both([&](Backend& backend, Device device) {
      const Tensor ids = Tensor::empty({0}, DType::I32, device);
      const Tensor dy = Tensor::empty({0, 4}, dtype, device);
      Tensor dweight = poisoned({6, 4}, dtype, device);
      backend.embedding_backward(ids, dy, dweight);
      return std::vector<Tensor>{dweight};
    });
  }
}

TEST_CASE("cuda cross_entropy of zero rows writes the CPU's loss", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  // The mean of no losses: 0 / 0, a NaN on both, whose sign and payload the CPU and a GPU
  // choose differently, so the losses are compared as values (a NaN needs a NaN, and the
  // poison fails), not bit for bit.
  const auto loss_of = [](Backend& backend, Device device, DType dtype) {
    const Tensor logits = Tensor::empty({0, 3}, dtype, device);
    const Tensor labels = Tensor::empty({0}, DType::I32, device);
    Tensor loss = poisoned({}, DType::F32, device);
    Tensor row_stats = Tensor::empty({0, 2}, DType::F32, device);
    backend.cross_entropy(logits, labels, loss, row_stats);
    return loss;
  };
  for (DType dtype : kFloatingTypes) {
    INFO(dtype);
    const Tensor expected = loss_of(cpu_backend(), kCPU, dtype);
    REQUIRE(element_bits(expected)[0] != poison_bits(DType::F32));
    expect_close(expected, loss_of(gpu_backend(), gpu(), dtype));
  }
}

TEST_CASE("cuda conv2d over zero input channels is its bias, or zero", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(72);
  for (DType dtype : kFloatingTypes) {
    for (const bool with_bias : {true, false}) {
      INFO(dtype << (with_bias ? ", with bias" : ", without bias"));
      const Tensor bias = random_tensor({3}, dtype, rng);
      check_both([&](Backend& backend, Device device) {
        const Tensor x = Tensor::empty({2, 0, 5, 5}, dtype, device);
        const Tensor w = Tensor::empty({3, 0, 3, 3}, dtype, device);
        const Tensor b = bias.to(device);
        Tensor y = poisoned({2, 3, 3, 3}, dtype, device);
        backend.conv2d(x, w, with_bias ? &b : nullptr, Conv2dDesc{}, y);
        return std::vector<Tensor>{y};
      });
    }
  }
}

TEST_CASE("cuda conv2d backward passes with nothing to sum write zeros", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  for (DType dtype : kFloatingTypes) {
    INFO(dtype);
    // No output channels: every input gradient is an empty sum.
    check_both([&](Backend& backend, Device device) {
      const Tensor dy = Tensor::empty({2, 0, 3, 3}, dtype, device);
      const Tensor w = Tensor::empty({0, 2, 3, 3}, dtype, device);
      Tensor dx = poisoned({2, 2, 5, 5}, dtype, device);
      backend.conv2d_backward_data(dy, w, Conv2dDesc{}, dx);
      return std::vector<Tensor>{dx};
    });
    // No samples: every filter and bias gradient is an empty sum.
    check_both([&](Backend& backend, Device device) {
      const Tensor x = Tensor::empty({0, 2, 5, 5}, dtype, device);
      const Tensor dy = Tensor::empty({0, 3, 3, 3}, dtype, device);
      Tensor dw = poisoned({3, 2, 3, 3}, dtype, device), dbias = poisoned({3}, dtype, device);
      backend.conv2d_backward_filter(x, dy, Conv2dDesc{}, dw, &dbias);
      return std::vector<Tensor>{dw, dbias};
    });
  }
}

TEST_CASE("cuda conv2d_backward_filter with one output position per channel copies dy into dbias",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(73);
  for (DType dtype : kFloatingTypes) {
    INFO(dtype);
    // One sample, a 3x3 image and a 3x3 filter without padding: one output position, so each
    // channel's bias gradient is its single dy value.
    const Tensor x = random_tensor({1, 2, 3, 3}, dtype, rng);
    const Tensor dy = random_tensor({1, 4, 1, 1}, dtype, rng);
    Tensor dw_e = Tensor::empty({4, 2, 3, 3}, dtype), db_e = Tensor::empty({4}, dtype);
    cpu_backend().conv2d_backward_filter(x, dy, Conv2dDesc{}, dw_e, &db_e);
    Tensor dw = poisoned({4, 2, 3, 3}, dtype), db = poisoned({4}, dtype);
    gpu_backend().conv2d_backward_filter(x.to(gpu()), dy.to(gpu()), Conv2dDesc{}, dw, &db);
    expect_bits_equal(db_e, db);
    expect_bits_equal(dy.reshape({4}), db);
    expect_close(dw_e, dw);
  }
}

TEST_CASE("cuda gemm with no rows, columns or batch runs without error", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  // The output is empty too, so there is nothing to compare: what is checked is that neither
  // backend refuses or faults (cuBLASLt cannot describe a matrix with a zero extent).
  struct Extents {
    int64_t m, n, batch;
  };
  for (DType dtype : kFloatingTypes) {
    for (const Extents& e : {Extents{0, 4, 1}, Extents{3, 0, 1}, Extents{3, 4, 0}}) {
      INFO(dtype << ", m " << e.m << ", n " << e.n << ", batch " << e.batch);
      const int64_t k = 5;
      GemmDesc d = ops::gemm_desc(false, false, e.m, e.n, k);
      d.batch = e.batch;
      d.stride_a = e.m * k;
      d.stride_b = k * e.n;
      d.stride_c = e.m * e.n;
      for (const Device device : {kCPU, gpu()}) {
        INFO(device);
        const Tensor a = Tensor::zeros({e.batch * e.m * k}, dtype, device);
        const Tensor b = Tensor::zeros({e.batch * k * e.n}, dtype, device);
        Tensor c = Tensor::empty({e.batch * e.m * e.n}, dtype, device);
        CHECK_NOTHROW(backend_for(device).gemm(d, a, b, c));
      }
    }
  }
}

}  // namespace
}  // namespace mixprec::cuda_test
