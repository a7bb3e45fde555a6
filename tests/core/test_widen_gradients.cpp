// Backend::widen_gradients on the CPU: the bits of cast() into F32, and of cast() then
// binary(Add) when accumulating, for every item of one call; and the items it refuses.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/backend.h"
#include "core/half.h"
#include "core/tensor.h"
#include "tests/core/cpu_test_util.h"
#include "tests/tensor_bytes.h"

using namespace mixprec;
using mixprec::testing::cpu_backend;
using mixprec_test::raw_bytes;

namespace {

// `n` values of `dtype`: random ones in [-3, 3) and, from the start, the special values a
// gradient can hold (signed zeros, infinities, a NaN with a payload, values that round to
// subnormals of the 16-bit type).
Tensor gradient_values(int64_t n, DType dtype, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  const float specials[] = {0.0f,  -0.0f, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), 3e-6f, -1e-39f, 65504.0f};
  std::vector<float> values(static_cast<size_t>(n));
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = i < std::size(specials) ? specials[i] : dist(rng);
  return Tensor::from_vector(values, {n}, dtype);
}


}  // namespace

TEST_CASE("widen_gradients gives cast's bits, and cast then add's when accumulating",
          "[core][amp]") {
  std::mt19937 rng(11);
  const int64_t sizes[] = {0, 1, 7, 1000, 4099};
  std::vector<Tensor> sources, destinations, expected;
  std::vector<GradientWidening> items;
  for (DType dtype : {DType::F16, DType::BF16}) {
    for (int64_t n : sizes) {
      for (bool accumulate : {false, true}) {
        const Tensor source = gradient_values(n, dtype, rng);
        const Tensor destination = gradient_values(n, DType::F32, rng);
        // The composition the call stands for.
        Tensor widened = Tensor::empty({n}, DType::F32);
        cpu_backend().cast(source, widened);
        Tensor want = widened;
        if (accumulate) {
          want = Tensor::empty({n}, DType::F32);
          cpu_backend().binary(BinaryOp::Add, destination, widened, want);
        }
        sources.push_back(source);
        destinations.push_back(destination);
        expected.push_back(want);
      }
    }
  }
  for (size_t k = 0; k < sources.size(); ++k)
    items.push_back({&sources[k], &destinations[k], k % 2 == 1});
  cpu_backend().widen_gradients(items);
  for (size_t k = 0; k < items.size(); ++k) {
    INFO("item " << k << ": " << describe(sources[k]) << (k % 2 == 1 ? ", accumulated" : ""));
    CHECK(raw_bytes(destinations[k]) == raw_bytes(expected[k]));
  }
  // Nothing to do is no error.
  cpu_backend().widen_gradients({});
}

TEST_CASE("widen_gradients lets sources share memory, but not destinations", "[core][amp]") {
  const Tensor source = Tensor::from_vector({1.5f, -2.0f}, {2}, DType::F16);
  Tensor a = Tensor::zeros({2}, DType::F32), b = Tensor::zeros({2}, DType::F32);
  // One gradient handed to two leaves.
  cpu_backend().widen_gradients({{&source, &a, false}, {&source, &b, true}});
  CHECK(a.to_float_vector() == std::vector<float>{1.5f, -2.0f});
  CHECK(b.to_float_vector() == std::vector<float>{1.5f, -2.0f});

  Tensor same = b;  // a second handle on b's memory
  const Tensor other = Tensor::from_vector({4.0f, 8.0f}, {2}, DType::F16);
  REQUIRE_THROWS_WITH(cpu_backend().widen_gradients({{&source, &b, false}, {&other, &same, false}}),
                      Catch::Contains("widen_gradients: the destination of item") &&
                          Catch::Contains("overlaps the destination of item"));
  // Refused before anything was written.
  CHECK(b.to_float_vector() == std::vector<float>{1.5f, -2.0f});
}

TEST_CASE("widen_gradients refuses items of other dtypes, shapes or none", "[core][amp]") {
  const Tensor f16 = Tensor::from_vector({1.0f, 2.0f}, {2}, DType::F16);
  const Tensor f32 = Tensor::from_vector({1.0f, 2.0f}, {2}, DType::F32);
  Tensor out = Tensor::zeros({2}, DType::F32);
  Tensor out16 = Tensor::zeros({2}, DType::F16);
  Tensor out3 = Tensor::zeros({3}, DType::F32);
  REQUIRE_THROWS_WITH(cpu_backend().widen_gradients({{&f32, &out, false}}),
                      Catch::Contains("item 0's source") && Catch::Contains("must be F16 or BF16"));
  REQUIRE_THROWS_WITH(cpu_backend().widen_gradients({{&f16, &out, false}, {&f16, &out16, false}}),
                      Catch::Contains("item 1's destination") && Catch::Contains("must be F32"));
  REQUIRE_THROWS_WITH(cpu_backend().widen_gradients({{&f16, &out3, false}}),
                      Catch::Contains("widen_gradients"));
  REQUIRE_THROWS_WITH(cpu_backend().widen_gradients({{&f16, nullptr, false}}),
                      Catch::Contains("item 0 lacks its destination"));
  REQUIRE_THROWS_WITH(cpu_backend().widen_gradients({{nullptr, &out, false}}),
                      Catch::Contains("item 0 lacks its source"));
  const Tensor undefined;
  REQUIRE_THROWS_WITH(cpu_backend().widen_gradients({{&undefined, &out, false}}),
                      Catch::Contains("source is undefined"));
  CHECK(out.to_float_vector() == std::vector<float>{0.0f, 0.0f});
}
