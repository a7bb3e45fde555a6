// The GEMM epilogues of the CPU backend (Backend::gemm_epilogue) and the ops built on them:
// linear's bias and linear_gelu. The stores are checked bit for bit against their definition
// (FP32 sums, bias added, one rounding), linear_gelu against gelu(linear) and finite
// differences, and every refusal of the contract.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/backend.h"
#include "core/half.h"
#include "core/math/elementwise.h"
#include "core/ops/gemm_desc.h"
#include "cpu_test_util.h"
#include "gradcheck.h"

namespace {

using namespace mixprec;
using namespace mixprec::testing;

constexpr int64_t kM = 37, kN = 13, kK = 29;

// A linear layer's product: x [m, k] times w [n, k] transposed.
GemmDesc linear_desc() { return ops::gemm_desc(false, true, kM, kN, kK); }

// The FP32 sums of the product with the bias added: what both epilogues start from.
std::vector<float> biased_sums(const Tensor& x, const Tensor& w, const Tensor& bias) {
  Tensor sums = Tensor::empty({kM, kN}, DType::F32);
  cpu_backend().gemm(linear_desc(), x, w, sums);  // 16-bit operands into F32: not rounded
  std::vector<float> s = sums.to_float_vector();
  const std::vector<float> b = bias.to_float_vector();
  for (int64_t i = 0; i < kM; ++i)
    for (int64_t j = 0; j < kN; ++j)
      s[static_cast<size_t>(i * kN + j)] += b[static_cast<size_t>(j)];
  return s;
}

// Each value rounded once into `dtype`.
Tensor rounded(const std::vector<float>& values, DType dtype) {
  return Tensor::from_vector(values, {kM, kN}, dtype);
}

std::vector<float> gelu_of(std::vector<float> v) {
  for (float& x : v) x = gelu_tanh(x);
  return v;
}

TEST_CASE("gemm_epilogue: Bias stores round(sum + bias) in every dtype", "[gemm][epilogue]") {
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    INFO(dtype_name(dtype));
    const Tensor x = random_tensor({kM, kK}, 1, -2.f, 2.f, dtype);
    const Tensor w = random_tensor({kN, kK}, 2, -2.f, 2.f, dtype);
    const Tensor bias = random_tensor({kN}, 3, -4.f, 4.f, dtype);
    Tensor c = Tensor::full({kM, kN}, 7.0f, dtype);  // beta 0: never read
    cpu_backend().gemm_epilogue(linear_desc(), GemmEpilogue::Bias, x, w, &bias, c, nullptr);
    CHECK(bits_of(c) == bits_of(rounded(biased_sums(x, w, bias), dtype)));
  }
}

TEST_CASE("gemm_epilogue: the GELU epilogues keep the (biased) sum and apply gelu before "
          "rounding", "[gemm][epilogue]") {
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    for (bool with_bias : {true, false}) {
      INFO(dtype_name(dtype) << (with_bias ? " with bias" : " without bias"));
      const Tensor x = random_tensor({kM, kK}, 4, -1.f, 1.f, dtype);
      const Tensor w = random_tensor({kN, kK}, 5, -1.f, 1.f, dtype);
      const Tensor bias = random_tensor({kN}, 6, -1.f, 1.f, dtype);
      Tensor c = Tensor::full({kM, kN}, 7.0f, dtype);
      Tensor pre = Tensor::full({kM, kN}, 7.0f, dtype);
      cpu_backend().gemm_epilogue(linear_desc(),
                                  with_bias ? GemmEpilogue::BiasGelu : GemmEpilogue::Gelu, x, w,
                                  with_bias ? &bias : nullptr, c, &pre);
      const std::vector<float> sums =
          biased_sums(x, w, with_bias ? bias : Tensor::zeros({kN}, dtype));
      CHECK(bits_of(pre) == bits_of(rounded(sums, dtype)));
      CHECK(bits_of(c) == bits_of(rounded(gelu_of(sums), dtype)));
      if (dtype != DType::F32) {
        // The one rounding is observable: gelu of the stored (rounded) sums differs somewhere.
        const std::vector<float> twice = gelu_of(pre.to_float_vector());
        CHECK(bits_of(c) != bits_of(rounded(twice, dtype)));
      }
    }
  }
}

TEST_CASE("gemm_epilogue: an empty sum (k = 0) stores the bias or gelu of it, and an empty C nothing",
          "[gemm][epilogue]") {
  for (DType dtype : {DType::F32, DType::F16}) {
    INFO(dtype_name(dtype));
    const Tensor x = Tensor::zeros({4, 0}, dtype);
    const Tensor w = Tensor::zeros({6, 0}, dtype);
    const Tensor bias = random_tensor({6}, 8, -2.f, 2.f, dtype);
    const GemmDesc d = ops::gemm_desc(false, true, 4, 6, 0);
    Tensor c = Tensor::full({4, 6}, 7.0f, dtype);
    Tensor pre = Tensor::full({4, 6}, 7.0f, dtype);
    cpu_backend().gemm_epilogue(d, GemmEpilogue::BiasGelu, x, w, &bias, c, &pre);
    const std::vector<float> b = bias.to_float_vector();
    for (int64_t i = 0; i < 24; ++i) {
      const float s = b[static_cast<size_t>(i % 6)];
      CHECK(pre.get(i) == s);
      CHECK(c.get(i) == Tensor::full({1}, gelu_tanh(s), dtype).get(0));
    }
    Tensor none = Tensor::zeros({0, 6}, dtype);
    cpu_backend().gemm_epilogue(ops::gemm_desc(false, true, 0, 6, 5), GemmEpilogue::Bias,
                                Tensor::zeros({0, 5}, dtype), Tensor::zeros({6, 5}, dtype), &bias,
                                none, nullptr);
    CHECK(none.numel() == 0);
  }
}

TEST_CASE("gemm_epilogue: refuses what its contract excludes", "[gemm][epilogue]") {
  const Tensor x = Tensor::zeros({kM, kK});
  const Tensor w = Tensor::zeros({kN, kK});
  const Tensor bias = Tensor::zeros({kN});
  Tensor c = Tensor::zeros({kM, kN});
  Tensor pre = Tensor::zeros({kM, kN});
  GemmDesc batched = linear_desc();
  batched.batch = 2;
  batched.stride_c = kM * kN;
  Tensor big_c = Tensor::zeros({2, kM, kN});
  CHECK_THROWS_WITH(
      cpu_backend().gemm_epilogue(batched, GemmEpilogue::Bias, x, w, &bias, big_c, nullptr),
      Catch::Contains("gemm_epilogue") && Catch::Contains("batch 2"));
  GemmDesc accumulating = linear_desc();
  accumulating.beta = 1.0f;
  CHECK_THROWS_WITH(
      cpu_backend().gemm_epilogue(accumulating, GemmEpilogue::Bias, x, w, &bias, c, nullptr),
      Catch::Contains("beta 0"));
  const Tensor long_bias = Tensor::zeros({kN + 1});
  CHECK_THROWS_WITH(
      cpu_backend().gemm_epilogue(linear_desc(), GemmEpilogue::Bias, x, w, &long_bias, c, nullptr),
      Catch::Contains("bias") && Catch::Contains("F32[14]") && Catch::Contains("[13]"));
  CHECK_THROWS_WITH(
      cpu_backend().gemm_epilogue(linear_desc(), GemmEpilogue::BiasGelu, x, w, &bias, c, nullptr),
      Catch::Contains("pre_gelu is required"));
  CHECK_THROWS_WITH(
      cpu_backend().gemm_epilogue(linear_desc(), GemmEpilogue::Bias, x, w, &bias, c, &pre),
      Catch::Contains("pre_gelu is only for the gelu epilogue"));
  CHECK_THROWS_WITH(
      cpu_backend().gemm_epilogue(linear_desc(), GemmEpilogue::Bias, x, w, nullptr, c, nullptr),
      Catch::Contains("the bias is required"));
  CHECK_THROWS_WITH(
      cpu_backend().gemm_epilogue(linear_desc(), GemmEpilogue::Gelu, x, w, &bias, c, &pre),
      Catch::Contains("the bias is only for the epilogues with a bias"));
  Tensor small_pre = Tensor::zeros({kM, kN - 1});
  CHECK_THROWS_WITH(cpu_backend().gemm_epilogue(linear_desc(), GemmEpilogue::BiasGelu, x, w, &bias,
                                                c, &small_pre),
                    Catch::Contains("too small"));
  Tensor pre16 = Tensor::zeros({kM, kN}, DType::F16);
  CHECK_THROWS_WITH(
      cpu_backend().gemm_epilogue(linear_desc(), GemmEpilogue::BiasGelu, x, w, &bias, c, &pre16),
      Catch::Contains("dtype mismatch"));
  const Tensor bias16 = bias.to(DType::BF16);
  CHECK_THROWS_WITH(
      cpu_backend().gemm_epilogue(linear_desc(), GemmEpilogue::Bias, x, w, &bias16, c, nullptr),
      Catch::Contains("dtype mismatch"));
}

TEST_CASE("linear_gelu: in FP32 the same bits as gelu(linear), forward and backward",
          "[gemm][epilogue]") {
  const Tensor x0 = random_tensor({3, 5, 24}, 11, -2.f, 2.f);
  const Tensor w0 = random_tensor({40, 24}, 12);
  const Tensor b0 = random_tensor({40}, 13);
  const Tensor g = random_tensor({3, 5, 40}, 14);
  for (bool with_bias : {true, false}) {
    INFO((with_bias ? "with bias" : "without bias"));
    std::vector<std::vector<uint32_t>> results[2];
    for (int fused = 0; fused < 2; ++fused) {
      Tensor x = x0.clone().set_requires_grad(true);
      Tensor w = w0.clone().set_requires_grad(true);
      Tensor b = with_bias ? b0.clone().set_requires_grad(true) : Tensor();
      const Tensor y = fused ? ops::linear_gelu(x, w, b) : ops::gelu(ops::linear(x, w, b));
      y.backward(g);
      for (const Tensor& t : {y, x.grad(), w.grad()}) results[fused].push_back(bits_of(t));
      if (with_bias) results[fused].push_back(bits_of(b.grad()));
    }
    CHECK(results[1] == results[0]);
  }
}

TEST_CASE("linear_gelu: FP16/BF16 forward and backward", "[gemm][epilogue]") {
  const Tensor x = random_tensor({4, 3, 40}, 31);
  const Tensor w = random_tensor({9, 40}, 32);
  const Tensor b = random_tensor({9}, 33);
  const auto f = [](const std::vector<Tensor>& in) {
    return ops::linear_gelu(in[0], in[1], in[2]);
  };
  for (DType dtype : {DType::F16, DType::BF16}) {
    check_low_precision("linear_gelu", f, {x, w, b}, dtype, 4.0);
    const double rtol = low_precision_rtol(dtype);
    check_low_precision_grads("linear_gelu", f, {x, w, b}, random_tensor({4, 3, 9}, 34), dtype,
                              rtol, {4 * rtol, 4 * rtol, 4 * rtol});
  }
}

TEST_CASE("linear_gelu: bad inputs name the op", "[gemm][epilogue]") {
  const Tensor x = Tensor::zeros({2, 5});
  const Tensor w = Tensor::zeros({3, 5});
  CHECK_THROWS_WITH(ops::linear_gelu(x, Tensor::zeros({3, 4}), Tensor::zeros({3})),
                    Catch::Contains("linear_gelu") && Catch::Contains("F32[3, 4]"));
  CHECK_THROWS_WITH(ops::linear_gelu(x, w, Tensor::zeros({4})),
                    Catch::Contains("linear_gelu") && Catch::Contains("must be [3]"));
  CHECK_THROWS_WITH(ops::linear_gelu(x, w.to(DType::F16)),
                    Catch::Contains("linear_gelu") && Catch::Contains("F16[3, 5]"));
}

}  // namespace
