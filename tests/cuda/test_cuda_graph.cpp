// CUDA graphs of the backend's work (cuda/cuda_graph.h): a captured sequence of ops runs
// nothing until replayed, each replay computes bit for bit what the same ops compute eagerly
// on the inputs as they are at the replay, replays take no new device memory, and a capture
// that meets a host synchronisation, an upload or the kernel profile fails with a clear
// error and leaves the backend as it was.
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend_agreement.h"
#include "core/error.h"
#include "core/generator.h"
#include "core/ops/ops.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_graph.h"
#include "cuda_backend_access.h"
#include "layers/parameter.h"
#include "profiling_scope.h"
#include "tests/error_message.h"

namespace {

using namespace mixprec;
using namespace mixprec::cuda_test;

using mixprec_test::error_message;

// A small CNN-and-head forward in FP16: conv with bias, ReLU, a linear with GELU fused, a
// softmax, and a cross-entropy against fixed labels.
struct Forward {
  Tensor weight, bias, head, head_bias, labels;

  explicit Forward(std::mt19937& rng)
      : weight(random_tensor({4, 3, 3, 3}, DType::F16, rng, -0.5f, 0.5f).to(gpu())),
        bias(random_tensor({4}, DType::F16, rng).to(gpu())),
        head(random_tensor({10, 4 * 7 * 7}, DType::F16, rng, -0.1f, 0.1f).to(gpu())),
        head_bias(random_tensor({10}, DType::F16, rng).to(gpu())),
        labels(Tensor::from_ints({1, 4, 9, 0, 3, 3}, {6}).to(gpu())) {}

  // The probabilities and the loss for x [6, 3, 9, 9].
  std::vector<Tensor> operator()(const Tensor& x) const {
    const Tensor features = ops::relu(ops::conv2d(x, weight, bias));
    const Tensor logits = ops::linear_gelu(features.reshape({6, 4 * 7 * 7}), head, head_bias);
    return {ops::softmax(logits), ops::cross_entropy(logits, labels)};
  }
};

// Writes `values` (a CPU tensor) into the existing GPU tensor `x`, keeping its address.
void overwrite(Tensor& x, const Tensor& values) {
  gpu_backend().copy_from_host(x.data(), values.data(), values.nbytes());
}

// One mixed-precision training step at the backend's level: y = x W^T + b with FP16 working
// copies, an MSE loss scaled by a constant 256, the backward (whose gradients the backend
// widens into the FP32 masters' gradients through a multi-tensor table), the unscale and
// check, the global norm and the clip, and one fused SGD step of every parameter that
// skips itself on found_inf and writes the working copies: five uploaded tables in all.
struct LinearStep {
  Parameter weight, bias;
  Tensor found_inf, flags, squared, norm;

  explicit LinearStep(uint64_t seed) {
    Generator gen(seed);
    weight = Parameter("fc.weight", Tensor::normal({8, 16}, gen, 0.f, 0.5f).to(gpu()));
    bias = Parameter("fc.bias", Tensor::normal({8}, gen, 0.f, 0.5f).to(gpu()));
    weight.set_working_dtype(DType::F16);
    bias.set_working_dtype(DType::F16);
    found_inf = Tensor::zeros({1}, DType::F32, gpu());
    flags = Tensor::zeros({2}, DType::I32, gpu());
    squared = Tensor::zeros({2}, DType::F32, gpu());
    norm = Tensor::zeros({1}, DType::F32, gpu());
  }

  void operator()(const Tensor& x, const Tensor& y) {
    const Tensor pred = ops::linear(x, weight.working(), bias.working());
    ops::mul_scalar(ops::mse_loss(pred.to(DType::F32), y), 256.0).backward();
    const std::vector<Tensor> grads = {weight.grad(), bias.grad()};
    Backend& backend = gpu_backend();
    backend.fill(found_inf, 0.0);
    backend.unscale_and_check(grads, 1.0 / 256.0, found_inf, flags);
    backend.squared_norms(grads, squared);
    backend.clip_by_total_norm(grads, squared, 0.5, norm);
    SgdHyper hyper;
    hyper.lr = 0.05f;
    hyper.weight_decay = 0.01f;
    std::vector<SgdParamStep> steps;
    Tensor masters[2] = {weight.master(), bias.master()};
    Tensor working[2] = {weight.working(), bias.working()};
    for (int i = 0; i < 2; ++i) steps.push_back({hyper, nullptr, &masters[i], &grads[i], nullptr, &working[i]});
    backend.sgd_steps(steps, nullptr, &found_inf);
  }
};

}  // namespace

TEST_CASE("a captured forward replays bit for bit what the eager ops compute", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(2026);
  const Forward forward(rng);
  Tensor x = random_tensor({6, 3, 9, 9}, DType::F16, rng).to(gpu());
  const std::vector<Tensor> eager_first = forward(x);  // also warms the plans and the cache

  std::vector<Tensor> outputs;
  CudaGraph graph(cuda_backend(), [&] { outputs = forward(x); });
  CHECK(graph.nodes() >= 5);
  CHECK(cuda_backend().allocator().stats().bytes_in_private_pools > 0);
  graph.replay();
  expect_bits_equal(eager_first[0], outputs[0]);
  expect_bits_equal(eager_first[1], outputs[1]);

  // New inputs in the same tensor: the replay reads them.
  overwrite(x, random_tensor({6, 3, 9, 9}, DType::F16, rng));
  const std::vector<Tensor> eager_second = forward(x);
  CHECK(element_bits(eager_second[1]) != element_bits(eager_first[1]));
  const CudaAllocatorStats before = cuda_backend().allocator().stats();
  for (int i = 0; i < 3; ++i) graph.replay();
  expect_bits_equal(eager_second[0], outputs[0]);
  expect_bits_equal(eager_second[1], outputs[1]);
  // Replays take no memory.
  const CudaAllocatorStats after = cuda_backend().allocator().stats();
  CHECK(after.allocations == before.allocations);
  CHECK(after.cuda_malloc_calls == before.cuda_malloc_calls);
}

TEST_CASE("a graph's memory is not handed to eager work while the graph lives", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(7);
  Tensor x = random_tensor({1000}, DType::F32, rng).to(gpu());
  const Tensor expected = ops::relu(ops::mul_scalar(x, 2.0));
  const void* scratch = nullptr;
  Tensor out;
  {
    CudaGraph graph(cuda_backend(), [&] {
      // The product is a temporary of the capture: freed inside it, its block stays the
      // graph's, so the eager tensor below cannot land on it and be overwritten by a replay.
      const Tensor doubled = ops::mul_scalar(x, 2.0);
      scratch = doubled.data();
      out = ops::relu(doubled);
    });
    const Tensor eager = ops::mul_scalar(x, 3.0);
    CHECK(eager.data() != scratch);
    graph.replay();
    expect_bits_equal(expected, out);
    expect_bits_equal(ops::mul_scalar(x, 3.0), eager);
  }
  // The graph is gone: its blocks serve eager work again, and `out` stays valid.
  CHECK(cuda_backend().allocator().stats().bytes_in_private_pools == 0);
  expect_bits_equal(expected, out);
}

TEST_CASE("a capture that meets a host sync, an upload or the kernel profile fails cleanly", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(11);
  const Tensor x = random_tensor({64}, DType::F32, rng).to(gpu());
  const Tensor expected = ops::relu(x);
  const CudaAllocatorStats before = cuda_backend().allocator().stats();

  const std::string synced = error_message([&] {
    CudaGraph graph(cuda_backend(), [&] { (void)ops::sum(ops::relu(x)).item(); });
  });
  INFO(synced);
  CHECK(synced.find("capturing a CUDA graph failed") != std::string::npos);
  CHECK(synced.find("cudaErrorStreamCaptureUnsupported") != std::string::npos);

  const std::string uploaded = error_message([&] {
    CudaGraph graph(cuda_backend(), [&] {
      (void)Tensor::from_vector({1.0f, 2.0f}, {2}, DType::F32).to(gpu());
    });
  });
  INFO(uploaded);
  CHECK(uploaded.find("copy from the host while the stream is being captured") !=
        std::string::npos);

  {
    ProfilingScope profiling;
    const std::string profiled = error_message([&] {
      CudaGraph graph(cuda_backend(), [&] { (void)ops::relu(x); });
    });
    INFO(profiled);
    CHECK(profiled.find("kernel profile is on") != std::string::npos);
  }

  // Nothing is left behind: no pool, no capture, and eager work runs as before.
  CHECK(cuda_backend().allocator().stats().bytes_in_private_pools == 0);
  CHECK(cuda_backend().allocator().stats().bytes_in_use == before.bytes_in_use);
  expect_bits_equal(expected, ops::relu(x));
  CHECK(ops::sum(x).item() == Approx(ops::sum(x).to(kCPU).item()));
}

TEST_CASE("a captured mixed-precision training step replays as the eager steps do", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::vector<Tensor> xs, ys;
  for (int step = 0; step < 4; ++step) {
    Generator gen(90 + static_cast<uint64_t>(step));
    xs.push_back(Tensor::normal({4, 16}, gen).to(DType::F16));
    ys.push_back(Tensor::normal({4, 8}, gen, 0.f, 4.f));
  }
  // The third step overflows: its input holds an FP16 infinity, so the step skips itself.
  {
    std::vector<float> values = xs[2].to_float_vector();
    values[5] = std::numeric_limits<float>::infinity();
    xs[2] = Tensor::from_vector(values, {4, 16}, DType::F16);
  }

  LinearStep eager(3);
  std::vector<std::vector<uint32_t>> eager_weights, eager_norms;
  for (int step = 0; step < 4; ++step) {
    eager.weight.zero_grad();
    eager.bias.zero_grad();
    eager(xs[step].to(gpu()), ys[step].to(gpu()));
    eager_weights.push_back(element_bits(eager.weight.master()));
    eager_norms.push_back(element_bits(eager.norm));
  }
  CHECK(element_bits(eager.found_inf) == std::vector<uint32_t>{0});  // the last step was taken
  CHECK(eager_weights[2] == eager_weights[1]);                        // the overflow skipped

  LinearStep captured(3);
  Tensor x = xs[0].to(gpu()), y = ys[0].to(gpu());
  CudaGraph graph(cuda_backend(), [&] { captured(x, y); });
  CHECK(element_bits(captured.weight.master()) != eager_weights[0]);  // nothing ran yet
  for (int step = 0; step < 4; ++step) {
    INFO("step " << step);
    overwrite(x, xs[step]);
    overwrite(y, ys[step]);
    graph.replay();
    CHECK(element_bits(captured.weight.master()) == eager_weights[step]);
    CHECK(element_bits(captured.norm) == eager_norms[step]);
  }
  expect_bits_equal(eager.weight.working(), captured.weight.working());
  expect_bits_equal(eager.bias.master(), captured.bias.master());
}
