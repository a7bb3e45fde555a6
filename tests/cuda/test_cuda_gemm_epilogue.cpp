// The GEMM epilogues (bias; GELU with or without bias, the pre-GELU sums kept), CUDA against
// the CPU backend: through cuBLASLt's fused BIAS / GELU_AUX(_BIAS) epilogues where the
// backend uses them, and through the separate epilogue kernel elsewhere (FP32 GELU outputs,
// rows not a multiple of 8 long, an empty sum k = 0). GPU outputs are poisoned first.
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backend_agreement.h"
#include "core/ops/gemm_desc.h"
#include "core/ops/ops.h"
#include "cuda/kernel_profile.h"
#include "gemm_magnitude.h"
#include "profiling_scope.h"
#if MIXPREC_CUDA_EMULATION
#include <cublasLt.h>

#include "cuda/emulation/runtime_emulation.h"
#include "tests/error_message.h"
#endif

namespace {

using namespace mixprec;
using namespace mixprec::cuda_test;

struct EpilogueCase {
  int64_t m, n, k;
};

// n = 24 (16-bit): every epilogue fused; n = 13 and 1: GELU through the separate kernel;
// k = 0: every epilogue through it (C is bias, or gelu of it).
constexpr EpilogueCase kCases[] = {
    {37, 24, 29}, {37, 13, 29}, {1, 1, 1}, {300, 64, 96}, {5, 16, 0}};

// What was summed into each output: the product's terms and the bias. GELU's slope stays
// below 1.13, so its output's error is measured against the same magnitude.
std::vector<float> epilogue_magnitude(const GemmDesc& d, const Tensor& x, const Tensor& w,
                                      const Tensor& bias) {
  std::vector<float> mag = gemm_magnitude(d, x, w, Tensor::zeros({d.m, d.n}));
  const std::vector<float> b = bias.to_float_vector();
  for (int64_t i = 0; i < d.m; ++i)
    for (int64_t j = 0; j < d.n; ++j)
      mag[static_cast<size_t>(i * d.n + j)] = 1.13f * (mag[static_cast<size_t>(i * d.n + j)] +
                                                       std::fabs(b[static_cast<size_t>(j)]));
  return mag;
}

TEST_CASE("cuda gemm_epilogue stores the CPU's bias and bias+GELU results", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(41);
  for (DType dtype : kFloatingTypes) {
    for (const EpilogueCase& s : kCases) {
      for (GemmEpilogue epilogue :
           {GemmEpilogue::Bias, GemmEpilogue::Gelu, GemmEpilogue::BiasGelu}) {
        const bool gelu = epilogue_has_gelu(epilogue), with_bias = epilogue_has_bias(epilogue);
        INFO(dtype_name(dtype) << " " << s.m << "x" << s.n << "x" << s.k << " epilogue "
                               << static_cast<int>(epilogue));
        const GemmDesc d = ops::gemm_desc(false, true, s.m, s.n, s.k);
        const Tensor x = random_tensor({s.m, s.k}, dtype, rng);
        const Tensor w = random_tensor({s.n, s.k}, dtype, rng);
        const Tensor bias =
            with_bias ? random_tensor({s.n}, dtype, rng) : Tensor::zeros({s.n}, dtype);
        const Tensor gpu_bias = bias.to(gpu());

        Tensor expected = Tensor::empty({s.m, s.n}, dtype);
        Tensor expected_pre = Tensor::empty({s.m, s.n}, dtype);
        cpu_backend().gemm_epilogue(d, epilogue, x, w, with_bias ? &bias : nullptr, expected,
                                    gelu ? &expected_pre : nullptr);
        Tensor actual = poisoned({s.m, s.n}, dtype);
        Tensor actual_pre = poisoned({s.m, s.n}, dtype);
        gpu_backend().gemm_epilogue(d, epilogue, x.to(gpu()), w.to(gpu()),
                                    with_bias ? &gpu_bias : nullptr, actual,
                                    gelu ? &actual_pre : nullptr);

        const Tolerance tol = accumulation_tolerance(dtype, s.k);
        const std::vector<float> mag = epilogue_magnitude(d, x, w, bias);
        expect_close(expected, actual, tol, mag);
        if (gelu) expect_close(expected_pre, actual_pre, tol, mag);
      }
    }
  }
}

TEST_CASE("cuda linear_gelu matches the CPU forward and backward", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(42);
  for (DType dtype : kFloatingTypes) {
    INFO(dtype_name(dtype));
    const Tensor x = random_tensor({4, 6, 32}, dtype, rng);
    const Tensor w = random_tensor({48, 32}, dtype, rng);
    const Tensor b = random_tensor({48}, dtype, rng);
    const Tensor g = random_tensor({4, 6, 48}, dtype, rng);
    std::vector<Tensor> results[2];
    for (Device device : {kCPU, gpu()}) {
      // Fresh leaves on each device (to() on the tensor's own device returns the tensor itself).
      Tensor xd = x.clone().to(device).set_requires_grad(true);
      Tensor wd = w.clone().to(device).set_requires_grad(true);
      Tensor bd = b.clone().to(device).set_requires_grad(true);
      const Tensor y = ops::linear_gelu(xd, wd, bd);
      y.backward(g.to(device));
      // And without a bias (cuBLASLt's GELU_AUX epilogue).
      Tensor xn = x.clone().to(device).set_requires_grad(true);
      const Tensor yn = ops::linear_gelu(xn, wd.detach());
      yn.backward(g.to(device));
      results[device == kCPU ? 0 : 1] = {y, xd.grad(), wd.grad(), bd.grad(), yn, xn.grad()};
    }
    // The gradients sum over 24 rows or 48 outputs and pass through gelu's slope.
    const Tolerance tol = accumulation_tolerance(dtype, 48);
    for (size_t i = 0; i < results[0].size(); ++i) {
      INFO("output " << i);
      expect_close(results[0][i], results[1][i].to(kCPU),
                   {tol.rtol * 8.0, tol.atol * 8.0});
    }
  }
}

TEST_CASE("cuda gemm_epilogue calls of one problem from two threads each add their own bias",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  // One plan serves both threads; its descriptor holds the bias pointer, which each call sets
  // before its matmul (under the plan's lock).
  std::mt19937 rng(43);
  const GemmDesc d = ops::gemm_desc(false, true, 8, 16, 8);
  const Tensor x = random_tensor({8, 8}, DType::F16, rng);
  const Tensor w = random_tensor({16, 8}, DType::F16, rng);
  const Tensor gx = x.to(gpu()), gw = w.to(gpu());
  Tensor biases[2] = {random_tensor({16}, DType::F16, rng), random_tensor({16}, DType::F16, rng)};
  Tensor expected[2];
  for (int t = 0; t < 2; ++t) {
    expected[t] = Tensor::empty({8, 16}, DType::F16);
    cpu_backend().gemm_epilogue(d, GemmEpilogue::Bias, x, w, &biases[t], expected[t], nullptr);
  }
  constexpr int kCalls = 200;
  std::vector<Tensor> results[2];
  const auto work = [&](int t) {
    const Tensor bias = biases[t].to(gpu());
    for (int i = 0; i < kCalls; ++i) {
      Tensor c = Tensor::empty({8, 16}, DType::F16, gpu());
      gpu_backend().gemm_epilogue(d, GemmEpilogue::Bias, gx, gw, &bias, c, nullptr);
      results[t].push_back(c);
    }
  };
  std::thread other(work, 1);
  work(0);
  other.join();
  // Two FP16 ulps of slack for another summation order; the other thread's bias would be
  // off by about 1 (the biases are uniform in [-2, 2)).
  for (int t = 0; t < 2; ++t) {
    const std::vector<float> e = expected[t].to_float_vector();
    int wrong = 0;
    for (const Tensor& c : results[t]) {
      const std::vector<float> a = c.to(kCPU).to_float_vector();
      for (size_t i = 0; i < e.size(); ++i)
        wrong += std::fabs(a[i] - e[i]) > 2e-3f * (1 + std::fabs(e[i]));
    }
    INFO("thread " << t);
    CHECK(wrong == 0);
  }
}

}  // namespace

#if MIXPREC_CUDA_EMULATION
namespace {

// Calls in the kernel profile of kernels whose name contains `part`.
int64_t calls_named(const std::string& part) {
  int64_t calls = 0;
  for (const KernelProfileRow& row : kernel_profile())
    if (row.kernel.find(part) != std::string::npos) calls += row.calls;
  return calls;
}

}  // namespace

TEST_CASE("cuda gemm_epilogue takes its own epilogue when cuBLASLt refuses the fused call",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  // The emulated cuBLASLt's heuristic offers an algorithm for the fused epilogue and its
  // matmul then refuses it, as a real one may for some layouts, with either status a real one
  // answers: the result must still be the CPU's, and the plan must remember the refusal (one
  // refused call, not one per call).
  const auto [status, rows] = GENERATE(std::pair{CUBLAS_STATUS_NOT_SUPPORTED, int64_t{19}},
                                       std::pair{CUBLAS_STATUS_INVALID_VALUE, int64_t{21}});
  INFO("status " << static_cast<int>(status));
  std::mt19937 rng(44);
  // A problem of this test and status only, so that its plan is new here.
  const GemmDesc d = ops::gemm_desc(false, true, rows, 40, 23);
  const Tensor x = random_tensor({rows, 23}, DType::F16, rng);
  const Tensor w = random_tensor({40, 23}, DType::F16, rng);
  const Tensor bias = random_tensor({40}, DType::F16, rng);
  const Tensor gx = x.to(gpu()), gw = w.to(gpu()), gbias = bias.to(gpu());
  Tensor expected = Tensor::empty({rows, 40}, DType::F16);
  cpu_backend().gemm_epilogue(d, GemmEpilogue::Bias, x, w, &bias, expected, nullptr);

  struct RefusalScope {
    explicit RefusalScope(cublasStatus_t refusal) {
      emulation::set_refuse_epilogue_matmuls(static_cast<int>(refusal));
    }
    ~RefusalScope() { emulation::set_refuse_epilogue_matmuls(CUBLAS_STATUS_SUCCESS); }
  } refusing(status);
  ProfilingScope profiling;
  const int64_t refused_before = emulation::refused_epilogue_matmuls();
  for (int call = 0; call < 3; ++call) {
    INFO("call " << call);
    Tensor actual = poisoned({rows, 40}, DType::F16);
    gpu_backend().gemm_epilogue(d, GemmEpilogue::Bias, gx, gw, &gbias, actual, nullptr);
    expect_close(expected, actual, accumulation_tolerance(DType::F16, 23),
                 epilogue_magnitude(d, x, w, bias));
  }
  CHECK(emulation::refused_epilogue_matmuls() - refused_before == 1);
  // The refused call ran nothing, and the profile leaves it out.
  CHECK(calls_named(std::to_string(rows) + "x40x23 (batch 1, trans_a 0, trans_b 1) F16->F16 +bias") ==
        0);
  CHECK(calls_named("gemm_epilogue_kernel") == 3);
}

TEST_CASE("cuda gemm_epilogue reports a cuBLASLt failure that is not a refusal", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  // Only NOT_SUPPORTED and INVALID_VALUE mean "not for these operands"; any other status of
  // the fused call is an error, not a silent fallback.
  std::mt19937 rng(45);
  const GemmDesc d = ops::gemm_desc(false, true, 17, 40, 23);  // a problem of this test only
  const Tensor gx = random_tensor({17, 23}, DType::F16, rng).to(gpu());
  const Tensor gw = random_tensor({40, 23}, DType::F16, rng).to(gpu());
  const Tensor gbias = random_tensor({40}, DType::F16, rng).to(gpu());
  struct FailureScope {
    FailureScope() { emulation::set_refuse_epilogue_matmuls(CUBLAS_STATUS_EXECUTION_FAILED); }
    ~FailureScope() { emulation::set_refuse_epilogue_matmuls(CUBLAS_STATUS_SUCCESS); }
  } failing;
  Tensor actual = Tensor::empty({17, 40}, DType::F16, gpu());
  const std::string message = mixprec_test::error_message(
      [&] { gpu_backend().gemm_epilogue(d, GemmEpilogue::Bias, gx, gw, &gbias, actual, nullptr); });
  CHECK(message.find("CUBLAS_STATUS_EXECUTION_FAILED") != std::string::npos);
}
#endif
