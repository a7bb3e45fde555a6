// The kernel profile (cuda/kernel_profile.h): every launch of a profiled stretch is counted
// once under its kernel and launching function, nothing is counted while it is off, the
// read-back in batches loses no launch, and a launch's own error still reaches its check.
#include <chrono>
#include <string>

#include "core/error.h"
#include "core/ops/gemm_desc.h"
#include "cuda/conv_autotune.h"
#include "cuda/cuda_backend.h"
#include "cuda/kernel_profile.h"
#include "cuda/kernels/fill.h"
#include "tests/cuda/backend_agreement.h"
#include "tests/cuda/profiling_scope.h"

namespace mixprec::cuda_test {
namespace {

int64_t calls_of(const std::string& kernel, const std::string& site_part = "") {
  int64_t calls = 0;
  for (const KernelProfileRow& row : kernel_profile()) {
    if (row.kernel == kernel && row.site.find(site_part) != std::string::npos) calls += row.calls;
  }
  return calls;
}

int64_t all_calls() {
  int64_t calls = 0;
  for (const KernelProfileRow& row : kernel_profile()) calls += row.calls;
  return calls;
}

TEST_CASE("the kernel profile counts each launch once under its kernel and launcher", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(5);
  const Tensor x = random_tensor({4, 33}, DType::F16, rng).to(gpu());
  Tensor y = Tensor::empty({4, 33}, DType::F16, gpu());
  Tensor dx = Tensor::empty({4, 33}, DType::F16, gpu());
  {
    const ProfilingScope profiling;
    for (int i = 0; i < 3; ++i) gpu_backend().softmax(x, y, false);
    gpu_backend().softmax_backward(y, x, dx, false);
    CHECK(calls_of("softmax_kernel<R>", "softmax") == 3);
    CHECK(calls_of("softmax_backward_kernel<R>", "softmax_backward") == 1);
    CHECK(all_calls() == 4);
    for (const KernelProfileRow& row : kernel_profile()) {
      CHECK(row.total_ms >= 0.0);
      // The launcher is named without the project's namespaces or its parameter list.
      CHECK(row.site.find("mixprec::") == std::string::npos);
      CHECK(row.site.find("cudaStream_t") == std::string::npos);
    }
    const std::string table = kernel_profile_table();
    INFO(table);
    CHECK(table.find("softmax_kernel<R>") != std::string::npos);
    CHECK(table.find("all timed launches") != std::string::npos);

    reset_kernel_profile();
    CHECK(all_calls() == 0);
    CHECK(kernel_profile_table() == "no kernel launches were timed\n");
  }
  // Off: launches are not counted.
  gpu_backend().softmax(x, y, false);
  CHECK(all_calls() == 0);
}

TEST_CASE("the kernel profile names cuBLASLt calls by their problem", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(6);
  const Tensor a = random_tensor({8, 16}, DType::F16, rng).to(gpu());
  const Tensor b = random_tensor({16, 24}, DType::F16, rng).to(gpu());
  Tensor c = Tensor::empty({8, 24}, DType::F32, gpu());
  GemmDesc desc;
  desc.m = 8;
  desc.n = 24;
  desc.k = 16;
  const ProfilingScope profiling;
  gpu_backend().gemm(desc, a, b, c);
  gpu_backend().gemm(desc, a, b, c);
  const std::vector<KernelProfileRow> rows = kernel_profile();
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].calls == 2);
  INFO(rows[0].kernel);
  CHECK(rows[0].kernel.find("cublasLtMatmul gemm 8x24x16") == 0);
  CHECK(rows[0].kernel.find("F16->F32") != std::string::npos);
  CHECK(rows[0].site.find("gemm") != std::string::npos);
  CHECK(rows[0].max_blocks == 0);  // a library call: its grid is cuBLASLt's
}

// Checks that exactly one profiled row is named for `function` and that its name is
// `function`, `problem` and then `algorithm` (the chosen algorithm and math type). A GPU's
// cuDNN ranks algorithms its own way, so there only the part up to the algorithm is
// checked; the emulated heuristic's ranking is fixed, and its choice checked too.
void check_conv_row(const std::string& function, const std::string& problem,
                    const std::string& algorithm) {
  std::vector<std::string> names;
  for (const KernelProfileRow& row : kernel_profile())
    if (row.kernel.rfind(function + " ", 0) == 0) names.push_back(row.kernel);
  REQUIRE(names.size() == 1);
  INFO(names[0]);
  CHECK(names[0].rfind(function + " " + problem, 0) == 0);
#if MIXPREC_CUDA_EMULATION
  CHECK(names[0] == function + " " + problem + algorithm);
#else
  (void)algorithm;
#endif
}

TEST_CASE("the kernel profile names cuDNN convolutions by their problem and algorithm",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(7);
  // Extents no other test uses, so each pass's plan is made here.
  const Conv2dDesc desc{.stride_h = 1, .stride_w = 2, .pad_h = 1, .pad_w = 0};
  const Tensor x = random_tensor({3, 2, 7, 9}, DType::F16, rng).to(gpu());
  const Tensor w = random_tensor({5, 2, 3, 3}, DType::F16, rng).to(gpu());
  const Tensor dy = random_tensor({3, 5, 7, 4}, DType::F16, rng).to(gpu());
  Tensor y = Tensor::empty({3, 5, 7, 4}, DType::F16, gpu());
  Tensor dx = Tensor::empty(x.shape(), DType::F16, gpu());
  Tensor dw = Tensor::empty(w.shape(), DType::F16, gpu());
  const std::string problem = "3x2x7x9 * 5x2x3x3 (stride 1x2, padding 1x0) F16, ";
  {
    const ConvNondeterministicScope deterministic(false);
    const ConvAutotuneScope heuristic(false);
    const ProfilingScope profiling;
    gpu_backend().conv2d(x, w, nullptr, desc, y);
    gpu_backend().conv2d_backward_data(dy, w, desc, dx);
    gpu_backend().conv2d_backward_filter(x, dy, desc, dw, nullptr);
    // The emulated heuristic ranks IMPLICIT_PRECOMP_GEMM first for the forward pass and
    // ALGO_1 first for both backward passes, all deterministic; 16-bit data runs on tensor
    // cores.
    check_conv_row("cudnnConvolutionForward", problem, "IMPLICIT_PRECOMP_GEMM, tensor op math");
    check_conv_row("cudnnConvolutionBackwardData", problem, "ALGO_1, tensor op math");
    check_conv_row("cudnnConvolutionBackwardFilter", problem, "ALGO_1, tensor op math");
  }
  {
    // F32 with TF32 off runs on FMA math whatever the heuristic names (on a GPU too, but only
    // the emulation's check reaches the math type).
    const Tensor x32 = x.to(DType::F32), w32 = w.to(DType::F32);
    Tensor y32 = Tensor::empty(y.shape(), DType::F32, gpu());
    const ConvNondeterministicScope deterministic(false);
    const ConvAutotuneScope heuristic(false);
    const ProfilingScope profiling;
    gpu_backend().conv2d(x32, w32, nullptr, desc, y32);
    check_conv_row("cudnnConvolutionForward", "3x2x7x9 * 5x2x3x3 (stride 1x2, padding 1x0) F32, ",
                   "IMPLICIT_PRECOMP_GEMM, FMA math");
  }
}

TEST_CASE("the kernel profile reads its events back in batches without losing a launch",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  Tensor out = Tensor::empty({3}, DType::F32, gpu());
  const ProfilingScope profiling;
  const int launches = kProfileBatch + 5;
  for (int i = 0; i < launches; ++i) {
    kernels::fill_f32(static_cast<float*>(out.data()), static_cast<float>(i), 3, nullptr);
  }
  CHECK(all_calls() == launches);
  CHECK(out.to(kCPU).to_float_vector() == std::vector<float>(3, static_cast<float>(launches - 1)));
}

TEST_CASE("the kernel profile keeps each kernel's largest grid and the host's time in it",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  Tensor out = Tensor::empty({1000}, DType::F32, gpu());
  const ProfilingScope profiling;
  auto* data = static_cast<float*>(out.data());
  const auto before = std::chrono::steady_clock::now();
  kernels::fill_f32(data, 1.0f, 3, nullptr);     // one block
  kernels::fill_f32(data, 1.0f, 1000, nullptr);  // four blocks of 256 threads
  kernels::fill_f32(data, 1.0f, 300, nullptr);   // two
  const double wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - before).count();
  const std::vector<KernelProfileRow> rows = kernel_profile();
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].calls == 3);
  CHECK(rows[0].max_blocks == 4);
  CHECK(rows[0].threads_per_block == 256);
  // Each launch call takes some host time, and all of it lies within the three calls.
  CHECK(rows[0].host_ms > 0.0);
  CHECK(rows[0].host_ms <= wall_ms);
  const std::string table = kernel_profile_table();
  INFO(table);
  CHECK(table.find("largest grid") != std::string::npos);
  CHECK(table.find(" 4x256  fill_f32_kernel") != std::string::npos);
  CHECK(table.find("host time inside the timed calls: ") != std::string::npos);
}

TEST_CASE("a profiled launch still reports a stale CUDA error at its check", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  Tensor out = Tensor::empty({4}, DType::F32, gpu());
  const ProfilingScope profiling;
  REQUIRE(cudaSetDevice(1 << 20) != cudaSuccess);
  CHECK_THROWS_AS(kernels::fill_f32(static_cast<float*>(out.data()), 1.0f, 4, nullptr), Error);
  // The device is still usable, and profiling goes on. On the backend's stream, which the
  // read below copies on: the default stream is not ordered with that one.
  kernels::fill_f32(static_cast<float*>(out.data()), 2.0f, 4,
                    dynamic_cast<CudaBackend&>(gpu_backend()).stream());
  CHECK(out.to(kCPU).to_float_vector() == std::vector<float>(4, 2.0f));
  CHECK(all_calls() >= 1);
}

TEST_CASE("the kernel profile shows which form a GEMM epilogue took", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(7);
  const Tensor x = random_tensor({8, 16}, DType::F16, rng).to(gpu());
  const auto kernels_of = [&](int64_t n) {
    const Tensor w = random_tensor({n, 16}, DType::F16, rng).to(gpu());
    const Tensor bias = random_tensor({n}, DType::F16, rng).to(gpu());
    Tensor y = Tensor::empty({8, n}, DType::F16, gpu());
    Tensor pre = Tensor::empty({8, n}, DType::F16, gpu());
    const ProfilingScope profiling;
    gpu_backend().gemm_epilogue(ops::gemm_desc(false, true, 8, n, 16), GemmEpilogue::BiasGelu, x,
                                w, &bias, y, &pre);
    std::string names;
    for (const KernelProfileRow& row : kernel_profile()) names += row.kernel + "\n";
    return names;
  };
  // Rows of 24: cuBLASLt's GELU_AUX_BIAS epilogue, in the one matmul.
  const std::string fused = kernels_of(24);
  INFO(fused);
  CHECK(fused.find("cublasLtMatmul gemm 8x24x16") != std::string::npos);
  CHECK(fused.find("+bias+gelu") != std::string::npos);
  CHECK(fused.find("gemm_epilogue_kernel") == std::string::npos);
  // Rows of 13 cannot hold cuBLASLt's pre-GELU matrix (its leading dimension must be a
  // multiple of 8): a plain product into FP32, then the epilogue kernel.
  const std::string separate = kernels_of(13);
  INFO(separate);
  CHECK(separate.find("F16->F32\n") != std::string::npos);
  CHECK(separate.find("+bias") == std::string::npos);
  CHECK(separate.find("gemm_epilogue_kernel") != std::string::npos);
}

}  // namespace
}  // namespace mixprec::cuda_test
