// Backend::attention_softmax and attention_softmax_backward on the CUDA backend: bit for bit
// the compositions they stand for on the same backend (so a training step takes the same
// values fused or not), and within the per-dtype tolerances of the CPU backend. Row lengths
// cover the scalar walk (7), the 4-pack walk (8) and block-wide rows, walked one by one
// (1030) and in packs (1032, 2048); outputs are poisoned first. The in-place forms
// causal_attention uses, and an operand too misaligned for pack stores, are covered too.
#include <cstdint>
#include <limits>
#include <random>

#include "cuda/cuda_backend.h"
#include "cuda/kernels/softmax.h"
#include "tests/cuda/backend_agreement.h"

namespace mixprec::cuda_test {
namespace {

constexpr PhiloxKey kKey{0xabcdefULL, 77};
const Shape kShapes[] = {{2, 3, 7, 7}, {2, 8, 8}, {3, 1030}, {1, 2, 5, 1030}, {2, 1032},
                         {1, 1, 3, 2048}};

// causal_mask, softmax, dropout and cast, each its own call of `be`.
void composed_forward(Backend& be, Device device, const Tensor& scores, float p, Tensor& probs,
                      Tensor& operand) {
  Tensor masked = Tensor::empty(scores.shape(), DType::F32, device);
  be.causal_mask(scores, -std::numeric_limits<float>::infinity(), masked);
  be.softmax(masked, probs, false);
  Tensor kept = probs;
  if (p > 0.0f) {
    kept = Tensor::empty(scores.shape(), DType::F32, device);
    be.dropout(probs, p, kKey, kept);
  }
  be.cast(kept, operand);
}

void composed_backward(Backend& be, Device device, const Tensor& probs, const Tensor& dprobs,
                       float p, Tensor& ds) {
  Tensor dy = dprobs;
  if (p > 0.0f) {
    dy = Tensor::empty(dprobs.shape(), DType::F32, device);
    be.dropout(dprobs, p, kKey, dy);
  }
  Tensor ds32 = Tensor::empty(dprobs.shape(), DType::F32, device);
  be.softmax_backward(probs, dy, ds32, false);
  be.cast(ds32, ds);
}

TEST_CASE("cuda attention_softmax is its composition bit for bit and agrees with the CPU",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(91);
  for (const Shape& shape : kShapes) {
    for (DType dtype : kFloatingTypes) {
      for (float p : {0.0f, 0.3f}) {
        INFO(shape_str(shape) << " " << dtype << " p " << p);
        Tensor scores = random_tensor(shape, DType::F32, rng, -6.0f, 6.0f);
        // A row with masked columns made NaN by a NaN in column 0, and one whose live scores
        // are all -inf, where the masked columns must come out as in the composition.
        const int64_t rows = shape[shape.size() - 2], cols = shape.back();
        if (rows >= 3 && cols >= 4) {
          float* s = scores.data_as<float>();
          s[cols] = std::numeric_limits<float>::quiet_NaN();
          for (int64_t j = 0; j <= 2; ++j) s[2 * cols + j] = -std::numeric_limits<float>::infinity();
        }
        const Tensor scores_gpu = on_gpu(scores);
        Tensor composed_probs = poisoned(shape, DType::F32), composed_operand = poisoned(shape, dtype);
        composed_forward(gpu_backend(), gpu(), scores_gpu, p, composed_probs, composed_operand);

        Tensor probs = poisoned(shape, DType::F32), operand = poisoned(shape, dtype);
        gpu_backend().attention_softmax(scores_gpu, p, kKey, probs, operand);
        expect_bits_equal(composed_probs, probs);
        expect_bits_equal(composed_operand, operand);

        Tensor in_place = scores_gpu.clone();
        Tensor operand2 = poisoned(shape, dtype);
        gpu_backend().attention_softmax(in_place, p, kKey, in_place, operand2);
        expect_bits_equal(composed_probs, in_place);
        expect_bits_equal(composed_operand, operand2);

        Tensor cpu_probs = Tensor::empty(shape, DType::F32), cpu_operand = Tensor::empty(shape, dtype);
        cpu_backend().attention_softmax(scores, p, kKey, cpu_probs, cpu_operand);
        expect_close(cpu_probs, probs);
        expect_close(cpu_operand, operand);
      }
    }
  }
}

TEST_CASE("cuda attention_softmax_backward is its composition bit for bit and agrees with the CPU",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(92);
  for (const Shape& shape : kShapes) {
    for (DType dtype : kFloatingTypes) {
      for (float p : {0.0f, 0.25f}) {
        INFO(shape_str(shape) << " " << dtype << " p " << p);
        const Tensor scores = random_tensor(shape, DType::F32, rng, -4.0f, 4.0f);
        Tensor probs = Tensor::empty(shape, DType::F32), unused = Tensor::empty(shape, DType::F32);
        cpu_backend().attention_softmax(scores, 0.0f, kKey, probs, unused);
        const Tensor dprobs = random_tensor(shape, DType::F32, rng, -3.0f, 3.0f);
        const Tensor probs_gpu = on_gpu(probs), dprobs_gpu = on_gpu(dprobs);

        Tensor composed = poisoned(shape, dtype);
        composed_backward(gpu_backend(), gpu(), probs_gpu, dprobs_gpu, p, composed);
        Tensor ds = poisoned(shape, dtype);
        gpu_backend().attention_softmax_backward(probs_gpu, dprobs_gpu, p, kKey, ds);
        expect_bits_equal(composed, ds);

        Tensor cpu_ds = Tensor::empty(shape, dtype);
        cpu_backend().attention_softmax_backward(probs, dprobs, p, kKey, cpu_ds);
        expect_close(cpu_ds, ds);
      }
    }
  }
}

TEST_CASE("cuda attention_softmax in place over F32 scores, and its backward over dprobs",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(93);
  for (const Shape& shape : {Shape{2, 3, 8, 8}, Shape{3, 1030}}) {
    INFO(shape_str(shape));
    const Tensor scores = on_gpu(random_tensor(shape, DType::F32, rng, -5.0f, 5.0f));
    Tensor expected = poisoned(shape, DType::F32), unused = poisoned(shape, DType::F32);
    composed_forward(gpu_backend(), gpu(), scores, 0.0f, expected, unused);
    // What causal_attention does for F32 without dropout: scores, probs and operand at once.
    Tensor all_in_one = scores.clone();
    gpu_backend().attention_softmax(all_in_one, 0.0f, kKey, all_in_one, all_in_one);
    expect_bits_equal(expected, all_in_one);

    const Tensor dprobs = on_gpu(random_tensor(shape, DType::F32, rng, -2.0f, 2.0f));
    Tensor expected_ds = poisoned(shape, DType::F32);
    composed_backward(gpu_backend(), gpu(), expected, dprobs, 0.25f, expected_ds);
    Tensor in_place = dprobs.clone();
    gpu_backend().attention_softmax_backward(expected, in_place, 0.25f, kKey, in_place);
    expect_bits_equal(expected_ds, in_place);
  }
}

TEST_CASE("cuda attention_softmax stores element by element into a misaligned operand",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  // Rows of 8 F32 scores read in packs, but an F16 operand one element off its 8-byte
  // alignment cannot take 4-packs: the kernel must fall back to single stores.
  std::mt19937 rng(94);
  const Shape shape{4, 8, 8};
  const int64_t n = shape_numel(shape);
  const Tensor scores = on_gpu(random_tensor(shape, DType::F32, rng, -3.0f, 3.0f));
  Tensor expected_probs = poisoned(shape, DType::F32), expected = poisoned(shape, DType::F16);
  composed_forward(gpu_backend(), gpu(), scores, 0.3f, expected_probs, expected);

  Tensor probs = poisoned(shape, DType::F32);
  Tensor padded = poisoned({n + 1}, DType::F16);
  auto& backend = dynamic_cast<CudaBackend&>(gpu_backend());
  kernels::attention_softmax(DType::F16, scores.data_as<float>(), 0.3f, kKey,
                             probs.data_as<float>(), static_cast<uint16_t*>(padded.data()) + 1,
                             n / 8, 8, 8, backend.stream());
  backend.synchronize();
  expect_bits_equal(expected_probs, probs);
  const std::vector<uint32_t> written = element_bits(padded), wanted = element_bits(expected);
  CHECK(written[0] == poison_bits(DType::F16));  // the element before stays untouched
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) differ += written[static_cast<size_t>(i + 1)] != wanted[static_cast<size_t>(i)];
  CHECK(differ == 0);
}

}  // namespace
}  // namespace mixprec::cuda_test
