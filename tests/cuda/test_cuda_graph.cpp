// CUDA graphs of the backend's work (cuda/cuda_graph.h): a captured sequence of ops runs
// nothing until replayed, each replay computes bit for bit what the same ops compute eagerly
// on the inputs as they are at the replay, replays take no new device memory, and a capture
// that meets a host synchronisation, an upload or the kernel profile fails with a clear
// error and leaves the backend as it was.
#include <random>
#include <string>
#include <vector>

#include "backend_agreement.h"
#include "core/error.h"
#include "core/ops/ops.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_graph.h"
#include "profiling_scope.h"
#include "tests/error_message.h"

namespace {

using namespace mixprec;
using namespace mixprec::cuda_test;

using mixprec_test::error_message;

CudaBackend& cuda_backend() { return dynamic_cast<CudaBackend&>(gpu_backend()); }

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
