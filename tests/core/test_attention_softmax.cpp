// Backend::attention_softmax and attention_softmax_backward on the CPU: bit for bit the
// compositions they stand for (causal_mask, softmax, dropout, cast; dropout,
// softmax_backward, cast), the causal softmax's values against exp written out, and the
// errors of bad arguments.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/backend.h"
#include "core/error.h"
#include "core/philox.h"
#include "core/tensor.h"
#include "cpu_test_util.h"
#include "gradcheck.h"

namespace mixprec {
namespace {

using testing::cpu_backend;

Tensor random_f32(const Shape& shape, std::mt19937& rng, float low, float high) {
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> values(static_cast<size_t>(shape_numel(shape)));
  for (float& v : values) v = dist(rng);
  return Tensor::from_vector(values, shape, DType::F32);
}

// A tensor whose every element is a NaN, so an element left unwritten shows.
Tensor poisoned(const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  std::vector<float> nans(static_cast<size_t>(t.numel()), std::numeric_limits<float>::quiet_NaN());
  const Tensor source = Tensor::from_vector(nans, shape, dtype);
  std::memcpy(t.data(), source.data(), t.nbytes());
  return t;
}

using mixprec::testing::bits_of;

void require_same_bits(const Tensor& expected, const Tensor& actual) {
  REQUIRE(expected.dtype() == actual.dtype());
  REQUIRE(expected.shape() == actual.shape());
  const std::vector<uint32_t> e = bits_of(expected), a = bits_of(actual);
  int64_t differ = 0;
  for (size_t i = 0; i < e.size(); ++i) differ += e[i] != a[i];
  INFO(differ << " of " << e.size() << " elements differ");
  CHECK(differ == 0);
}

constexpr PhiloxKey kKey{0x5eedULL, 1234};
const Shape kShapes[] = {{1, 1}, {7, 7}, {2, 3, 5, 5}, {3, 4, 6}, {2, 9, 8}};
constexpr DType kDtypes[] = {DType::F32, DType::F16, DType::BF16};

// The composition attention_softmax stands for, each step its own backend call.
void composed_forward(const Tensor& scores, float p, Tensor& probs, Tensor& operand) {
  Tensor masked = Tensor::empty(scores.shape(), DType::F32);
  cpu_backend().causal_mask(scores, -std::numeric_limits<float>::infinity(), masked);
  cpu_backend().softmax(masked, probs, false);
  Tensor kept = probs;
  if (p > 0.0f) {
    kept = Tensor::empty(scores.shape(), DType::F32);
    cpu_backend().dropout(probs, p, kKey, kept);
  }
  cpu_backend().cast(kept, operand);
}

void composed_backward(const Tensor& probs, const Tensor& dprobs, float p, Tensor& ds) {
  Tensor dy = dprobs;
  if (p > 0.0f) {
    dy = Tensor::empty(dprobs.shape(), DType::F32);
    cpu_backend().dropout(dprobs, p, kKey, dy);
  }
  Tensor ds32 = Tensor::empty(dprobs.shape(), DType::F32);
  cpu_backend().softmax_backward(probs, dy, ds32, false);
  cpu_backend().cast(ds32, ds);
}

TEST_CASE("attention_softmax is the causal mask, softmax, dropout and cast bit for bit",
          "[core][attention]") {
  std::mt19937 rng(71);
  for (const Shape& shape : kShapes) {
    for (DType dtype : kDtypes) {
      for (float p : {0.0f, 0.3f}) {
        INFO(shape_str(shape) << " " << dtype << " p " << p);
        Tensor scores = random_f32(shape, rng, -6.0f, 6.0f);
        // Special values: a -inf, a large score and a NaN (its row turns NaN, as in softmax).
        if (scores.numel() >= 20) {
          float* s = scores.data_as<float>();
          s[6] = -std::numeric_limits<float>::infinity();
          s[12] = 80.0f;
          s[scores.numel() - 1] = std::numeric_limits<float>::quiet_NaN();
        }
        // Rows with masked columns whose live part makes them NaN: a NaN in column 0 (row 1),
        // and every live score -inf (row 2, so the maximum is -inf). Their masked columns are
        // NaN too, and dropout has to draw for them.
        const int64_t rows = shape[shape.size() - 2], cols = shape.back();
        if (rows >= 3 && cols >= 4) {
          float* s = scores.data_as<float>();
          s[cols] = std::numeric_limits<float>::quiet_NaN();
          for (int64_t j = 0; j <= 2; ++j) s[2 * cols + j] = -std::numeric_limits<float>::infinity();
        }
        Tensor expected_probs = Tensor::empty(shape, DType::F32);
        Tensor expected_operand = Tensor::empty(shape, dtype);
        composed_forward(scores, p, expected_probs, expected_operand);

        Tensor probs = poisoned(shape, DType::F32), operand = poisoned(shape, dtype);
        cpu_backend().attention_softmax(scores, p, kKey, probs, operand);
        require_same_bits(expected_probs, probs);
        require_same_bits(expected_operand, operand);

        // In place over the scores.
        Tensor in_place = scores.clone();
        Tensor operand2 = poisoned(shape, dtype);
        cpu_backend().attention_softmax(in_place, p, kKey, in_place, operand2);
        require_same_bits(expected_probs, in_place);
        require_same_bits(expected_operand, operand2);
      }
    }
  }
}

TEST_CASE("attention_softmax writes F32 probabilities once when the operand is probs itself",
          "[core][attention]") {
  std::mt19937 rng(72);
  const Tensor scores = random_f32({2, 6, 6}, rng, -3.0f, 3.0f);
  Tensor expected_probs = Tensor::empty({2, 6, 6}, DType::F32);
  Tensor expected_operand = Tensor::empty({2, 6, 6}, DType::F32);
  composed_forward(scores, 0.0f, expected_probs, expected_operand);
  Tensor probs = poisoned({2, 6, 6}, DType::F32);
  cpu_backend().attention_softmax(scores, 0.0f, kKey, probs, probs);
  require_same_bits(expected_probs, probs);
}

TEST_CASE("attention_softmax's rows are the causal softmax written out", "[core][attention]") {
  // Row i of each [R, C] matrix is exp(s_j) / sum_{k <= i} exp(s_k) for j <= i and 0 right of
  // the diagonal; with dropout, each element is either 0 or that value / (1 - p).
  std::mt19937 rng(73);
  const int64_t batch = 2, rows = 4, cols = 6;
  const Tensor scores = random_f32({batch, rows, cols}, rng, -5.0f, 5.0f);
  const float p = 0.5f;
  Tensor probs = poisoned(scores.shape(), DType::F32);
  Tensor operand = poisoned(scores.shape(), DType::F32);
  cpu_backend().attention_softmax(scores, p, kKey, probs, operand);
  const std::vector<float> s = scores.to_float_vector(), y = probs.to_float_vector(),
                           kept = operand.to_float_vector();
  int64_t dropped = 0;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t row = (b * rows + i) * cols;
      double sum = 0.0;
      for (int64_t j = 0; j <= i; ++j) sum += std::exp(static_cast<double>(s[row + j]));
      for (int64_t j = 0; j < cols; ++j) {
        const double expected = j <= i ? std::exp(static_cast<double>(s[row + j])) / sum : 0.0;
        INFO("batch " << b << " row " << i << " column " << j);
        CHECK(y[row + j] == Approx(expected).margin(1e-7).epsilon(1e-6));
        if (kept[row + j] == 0.0f) {
          ++dropped;
        } else {
          CHECK(kept[row + j] == Approx(expected / (1.0 - p)).epsilon(1e-6));
        }
      }
    }
  }
  // 48 elements, half of them right of the diagonal (zero either way): some of the rest
  // must be dropped and some kept for the dropout to be real.
  CHECK(dropped > 24);
  CHECK(dropped < 48);
}

TEST_CASE("attention_softmax_backward is dropout, softmax_backward and cast bit for bit",
          "[core][attention]") {
  std::mt19937 rng(74);
  for (const Shape& shape : kShapes) {
    for (DType dtype : kDtypes) {
      for (float p : {0.0f, 0.25f}) {
        INFO(shape_str(shape) << " " << dtype << " p " << p);
        const Tensor scores = random_f32(shape, rng, -4.0f, 4.0f);
        Tensor probs = Tensor::empty(shape, DType::F32), unused = Tensor::empty(shape, dtype);
        composed_forward(scores, 0.0f, probs, unused);
        Tensor dprobs = random_f32(shape, rng, -3.0f, 3.0f);
        if (dprobs.numel() >= 10) dprobs.data_as<float>()[3] = std::numeric_limits<float>::infinity();
        Tensor expected = Tensor::empty(shape, dtype);
        composed_backward(probs, dprobs, p, expected);

        Tensor ds = poisoned(shape, dtype);
        cpu_backend().attention_softmax_backward(probs, dprobs, p, kKey, ds);
        require_same_bits(expected, ds);
        if (dtype == DType::F32) {
          Tensor in_place = dprobs.clone();
          cpu_backend().attention_softmax_backward(probs, in_place, p, kKey, in_place);
          require_same_bits(expected, in_place);
        }
      }
    }
  }
}

TEST_CASE("attention_softmax and its backward reject bad arguments with clear errors",
          "[core][attention]") {
  const Tensor scores = Tensor::zeros({2, 3, 3}, DType::F32);
  Tensor probs = Tensor::empty({2, 3, 3}, DType::F32);
  Tensor operand = Tensor::empty({2, 3, 3}, DType::F16);
  const Tensor half_scores = Tensor::zeros({2, 3, 3}, DType::F16);
  CHECK_THROWS_WITH(cpu_backend().attention_softmax(half_scores, 0.0f, kKey, probs, operand),
                    Catch::Contains("must be F32"));
  Tensor short_probs = Tensor::empty({2, 3, 2}, DType::F32);
  CHECK_THROWS_AS(cpu_backend().attention_softmax(scores, 0.0f, kKey, short_probs, operand), Error);
  CHECK_THROWS_WITH(cpu_backend().attention_softmax(scores, 1.0f, kKey, probs, operand),
                    Catch::Contains("[0, 1)"));
  CHECK_THROWS_WITH(cpu_backend().attention_softmax(scores, 0.1f, kKey, probs, probs),
                    Catch::Contains("only when it is F32 and p is 0"));
  Tensor scores_copy = scores.clone();
  CHECK_THROWS_WITH(cpu_backend().attention_softmax(scores_copy, 0.1f, kKey, probs, scores_copy),
                    Catch::Contains("only when it is F32 and p is 0"));
  const Tensor vector = Tensor::zeros({3}, DType::F32);
  Tensor vector_out = Tensor::empty({3}, DType::F32);
  CHECK_THROWS_WITH(cpu_backend().attention_softmax(vector, 0.0f, kKey, vector_out, vector_out),
                    Catch::Contains("at least 2 dimensions"));
  Tensor ints = Tensor::empty({2, 3, 3}, DType::I32);
  CHECK_THROWS_WITH(cpu_backend().attention_softmax(scores, 0.0f, kKey, probs, ints),
                    Catch::Contains("must be floating"));

  const Tensor dprobs = Tensor::zeros({2, 3, 3}, DType::F32);
  Tensor ds = Tensor::empty({2, 3, 3}, DType::F16);
  CHECK_THROWS_WITH(cpu_backend().attention_softmax_backward(probs, half_scores, 0.0f, kKey, ds),
                    Catch::Contains("must be F32"));
  CHECK_THROWS_WITH(cpu_backend().attention_softmax_backward(probs, dprobs, -0.5f, kKey, ds),
                    Catch::Contains("[0, 1)"));
  Tensor dprobs_copy = dprobs.clone();
  CHECK_NOTHROW(
      cpu_backend().attention_softmax_backward(probs, dprobs_copy, 0.0f, kKey, dprobs_copy));
  Tensor short_ds = Tensor::empty({2, 3}, DType::F16);
  CHECK_THROWS_AS(cpu_backend().attention_softmax_backward(probs, dprobs, 0.0f, kKey, short_ds),
                  Error);
}

}  // namespace
}  // namespace mixprec
