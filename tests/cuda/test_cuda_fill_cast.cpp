// Fills, Philox random fills, casts, copies and the checks, CUDA against the CPU backend.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "backend_agreement.h"
#include "core/philox.h"

namespace {

using namespace mixprec;
using namespace mixprec::cuda_test;

constexpr DType kAllTypes[] = {DType::F32, DType::F16, DType::BF16, DType::I32};

// A host tensor of the given bit patterns (elements of `dtype`'s size).
Tensor from_bits(const std::vector<uint32_t>& bits, DType dtype) {
  Tensor t = Tensor::empty({static_cast<int64_t>(bits.size())}, dtype);
  const size_t esize = dtype_size(dtype);
  auto* p = static_cast<unsigned char*>(t.data());
  for (size_t i = 0; i < bits.size(); ++i) std::memcpy(p + i * esize, &bits[i], esize);
  return t;
}

uint32_t f32_bits(float f) { return detail::f32_to_bits(f); }

}  // namespace

TEST_CASE("cuda fill matches the CPU bit for bit", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  for (DType dtype : kAllTypes) {
    for (int64_t n : kOddSizes) {
      // 0.1 rounds differently in every dtype; -3.7 truncates to -3 in I32; 1e6 overflows F16.
      for (double value : {0.1, -3.7, 1e6}) {
        INFO(dtype << " [" << n << "] fill " << value);
        Tensor expected = Tensor::empty({n}, dtype);
        cpu_backend().fill(expected, value);
        Tensor actual = poisoned({n}, dtype);
        gpu_backend().fill(actual, value);
        expect_bits_equal(expected, actual);
      }
    }
  }
}

TEST_CASE("cuda arange matches the CPU", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  for (DType dtype : kAllTypes) {
    for (int64_t n : kOddSizes) {
      for (auto [start, step] : {std::pair{0.0, 1.0}, std::pair{-5.5, 0.25}, std::pair{3.0, -2.0}}) {
        INFO(dtype << " [" << n << "] arange from " << start << " by " << step);
        Tensor expected = Tensor::empty({n}, dtype);
        cpu_backend().arange(expected, start, step);
        Tensor actual = poisoned({n}, dtype);
        gpu_backend().arange(actual, start, step);
        // Every value start + i * step here is exact in double.
        expect_bits_equal(expected, actual);
      }
    }
  }
}

TEST_CASE("cuda Philox fills draw the CPU's numbers", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  const PhiloxKey key{0x5EEDull << 20, 12345};
  for (DType dtype : kFloatingTypes) {
    for (int64_t n : kOddSizes) {
      INFO(dtype << " [" << n << "]");
      // On [-1, 1) every product and sum is exact (multiples of 2^-23 below 1 in magnitude),
      // so both backends round the same value once.
      Tensor expected = Tensor::empty({n}, dtype);
      cpu_backend().random_uniform(expected, key, -1.0f, 1.0f);
      Tensor actual = poisoned({n}, dtype);
      gpu_backend().random_uniform(actual, key, -1.0f, 1.0f);
      expect_bits_equal(expected, actual);

      cpu_backend().random_uniform(expected, key, 0.5f, 3.0f);
      gpu_backend().random_uniform(actual, key, 0.5f, 3.0f);
      expect_close(expected, actual);

      // Box-Muller goes through logf and cosf, whose last bit differs between libm and CUDA.
      cpu_backend().random_normal(expected, key, 1.0f, 2.0f);
      poison(actual);
      gpu_backend().random_normal(actual, key, 1.0f, 2.0f);
      expect_close(expected, actual);
    }
  }
  // The counter offset is honoured: element i of a fill at offset k + 1 is element i + 1 of
  // the fill at offset k.
  Tensor first = poisoned({8}, DType::F32), shifted = poisoned({7}, DType::F32);
  gpu_backend().random_uniform(first, {7, 100}, 0.0f, 1.0f);
  gpu_backend().random_uniform(shifted, {7, 101}, 0.0f, 1.0f);
  const std::vector<float> a = first.to_float_vector(), b = shifted.to_float_vector();
  CHECK(std::vector<float>(a.begin() + 1, a.end()) == b);
  CHECK(a[0] == philox_uniform(7, 100));
}

TEST_CASE("cuda casts between floating dtypes match the CPU bit for bit, special values included", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  const float inf = std::numeric_limits<float>::infinity();
  // Signed zeros, infinities, a quiet and a signalling NaN with payloads, FP32 and FP16
  // subnormals, the FP16 overflow threshold and its neighbour, and ties to even in FP16
  // (1 + 2^-11) and BF16 (1 + 2^-8).
  std::vector<uint32_t> f32 = {
      f32_bits(0.0f),   f32_bits(-0.0f),      f32_bits(inf),         f32_bits(-inf),
      0x7FC12345u,      0xFFA00001u,          f32_bits(1e-40f),      f32_bits(-3e-6f),
      f32_bits(6e-8f),  f32_bits(65519.0f),   f32_bits(65520.0f),    f32_bits(1.0f + 0x1p-11f),
      f32_bits(1.0f + 0x1p-8f), f32_bits(3.0e38f), f32_bits(-1.5f),  f32_bits(0.1f)};
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
  while (f32.size() < 4097) f32.push_back(f32_bits(dist(rng)));

  const Tensor source = from_bits(f32, DType::F32);
  for (DType from : kFloatingTypes) {
    // The source in each dtype is itself produced by the CPU cast, so it holds that dtype's
    // special values too (e.g. FP16 subnormals and NaN payloads).
    Tensor x = Tensor::empty(source.shape(), from);
    cpu_backend().cast(source, x);
    for (DType to : kFloatingTypes) {
      if (from == to) continue;
      for (int64_t n : kOddSizes) {
        INFO(from << " -> " << to << " [" << n << "]");
        Tensor xs = Tensor::empty({n}, from);
        std::memcpy(xs.data(), x.data(), xs.nbytes());
        Tensor expected = Tensor::empty({n}, to);
        cpu_backend().cast(xs, expected);
        Tensor actual = poisoned({n}, to);
        gpu_backend().cast(xs.to(gpu()), actual);
        expect_bits_equal(expected, actual);
      }
    }
  }
}

// The device converts non-NaN FP16 values with the hardware's cvt instructions and the host
// with integer code (core/half.h); they must agree everywhere, which these inputs pin down:
// every FP16 pattern widened, and narrowed every FP16 value, the midpoint to its successor
// (a tie, broken to even) and the floats on either side of that midpoint, over the whole
// range, both signs, subnormals and the overflow threshold included. On the emulated backend
// both sides take the integer path (no __CUDA_ARCH__ there): the test has teeth on a GPU.
TEST_CASE("cuda FP16 casts match the CPU for every FP16 value and rounding boundary", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::vector<uint32_t> halves;
  for (uint32_t h = 0; h <= 0xFFFFu; ++h) halves.push_back(h);
  const Tensor all_halves = from_bits(halves, DType::F16);
  Tensor widened_cpu = Tensor::empty(all_halves.shape(), DType::F32);
  cpu_backend().cast(all_halves, widened_cpu);
  Tensor widened_gpu = poisoned(all_halves.shape(), DType::F32);
  gpu_backend().cast(all_halves.to(gpu()), widened_gpu);
  expect_bits_equal(widened_cpu, widened_gpu);

  std::vector<uint32_t> floats;
  for (uint32_t h = 0; h < 0x7C00u; ++h) {  // every finite non-negative FP16 value
    const float value = half_bits_to_float(static_cast<uint16_t>(h));
    const float next = h + 1 < 0x7C00u ? half_bits_to_float(static_cast<uint16_t>(h + 1))
                                       : 65536.0f;  // where the overflow midpoint is measured
    const float midpoint = value + (next - value) / 2;  // exact: 11 bits need no rounding
    for (float f : {value, midpoint, std::nextafter(midpoint, 0.0f),
                    std::nextafter(midpoint, std::numeric_limits<float>::infinity())}) {
      floats.push_back(f32_bits(f));
      floats.push_back(f32_bits(-f));
    }
  }
  for (float f : {1e-45f, 1e-38f, 0x1p-25f, 70000.0f, 3e38f})  // below and beyond FP16's range
    floats.push_back(f32_bits(f));
  const Tensor sources = from_bits(floats, DType::F32);
  Tensor narrowed_cpu = Tensor::empty(sources.shape(), DType::F16);
  cpu_backend().cast(sources, narrowed_cpu);
  Tensor narrowed_gpu = poisoned(sources.shape(), DType::F16);
  gpu_backend().cast(sources.to(gpu()), narrowed_gpu);
  expect_bits_equal(narrowed_cpu, narrowed_gpu);
}

TEST_CASE("cuda casts to and from I32 match the CPU bit for bit", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  // Values every dtype converts to I32 without overflow; truncation toward zero on both
  // sides of zero; integers past 2^24 that float must round.
  std::vector<float> values = {0.0f, -0.0f, 2.7f, -2.7f, 0.99f, -0.99f, 255.5f, -32768.0f};
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-30000.0f, 30000.0f);
  while (values.size() < 4097) values.push_back(dist(rng));
  std::vector<int32_t> ints = {0, -1, 1, 16777217, -16777217, 2147483647, -2147483647 - 1, 65519};
  std::uniform_int_distribution<int32_t> idist(-100000000, 100000000);
  while (ints.size() < 4097) ints.push_back(idist(rng));

  for (int64_t n : kOddSizes) {
    const std::vector<float> v(values.begin(), values.begin() + n);
    const std::vector<int32_t> k(ints.begin(), ints.begin() + n);
    const Tensor ids = Tensor::from_ints(k, {n});
    for (DType dtype : kFloatingTypes) {
      INFO(dtype << " <-> I32 [" << n << "]");
      const Tensor x = Tensor::from_vector(v, {n}, dtype);
      Tensor expected = Tensor::empty({n}, DType::I32);
      cpu_backend().cast(x, expected);
      Tensor actual = poisoned({n}, DType::I32);
      gpu_backend().cast(x.to(gpu()), actual);
      expect_bits_equal(expected, actual);

      Tensor expected_back = Tensor::empty({n}, dtype);
      cpu_backend().cast(ids, expected_back);
      Tensor actual_back = poisoned({n}, dtype);
      gpu_backend().cast(ids.to(gpu()), actual_back);
      expect_bits_equal(expected_back, actual_back);
    }
  }
}

TEST_CASE("cuda copy is a raw copy of every dtype", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(9);
  for (DType dtype : kAllTypes) {
    for (int64_t n : kOddSizes) {
      INFO(dtype << " [" << n << "]");
      std::vector<uint32_t> bits(static_cast<size_t>(n));
      for (uint32_t& b : bits) b = rng() & (dtype_size(dtype) == 2 ? 0xFFFFu : 0xFFFFFFFFu);
      const Tensor x = from_bits(bits, dtype);
      Tensor y = poisoned({n}, dtype);
      gpu_backend().copy(x.to(gpu()), y);
      expect_bits_equal(x, y);
    }
  }
}

TEST_CASE("cuda all_finite finds one Inf or NaN anywhere", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(11);
  for (DType dtype : kFloatingTypes) {
    for (int64_t n : kOddSizes) {
      INFO(dtype << " [" << n << "]");
      const Tensor clean = random_tensor({n}, dtype, rng);
      CHECK(gpu_backend().all_finite(clean.to(gpu())));
      // The first element, one in the vector body, and the last one (in the scalar tail
      // when n is not a multiple of the vector width).
      for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
        for (double bad : {std::numeric_limits<double>::infinity(), std::nan("")}) {
          Tensor x = clean.clone();
          x.set(at, bad);
          CHECK_FALSE(gpu_backend().all_finite(x.to(gpu())));
          CHECK(cpu_backend().all_finite(x) == gpu_backend().all_finite(x.to(gpu())));
        }
      }
    }
  }
  CHECK(gpu_backend().all_finite(Tensor::from_ints({1, -5, 7}, {3}, gpu())));
  CHECK(gpu_backend().all_finite(Tensor::empty({0}, DType::F16, gpu())));
}

TEST_CASE("cuda find_out_of_range returns the first bad index", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  for (int64_t n : kOddSizes) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>(i % 10);
    INFO("[" << n << "]");
    CHECK(gpu_backend().find_out_of_range(Tensor::from_ints(ids, {n}, gpu()), 10) == -1);
    std::vector<int32_t> bad = ids;
    bad[static_cast<size_t>(n - 1)] = 10;
    if (n > 3) {
      bad[static_cast<size_t>(n / 2)] = -1;
      bad[static_cast<size_t>(n - 2)] = 1000;
    }
    const Tensor host = Tensor::from_ints(bad, {n});
    const int64_t expected = cpu_backend().find_out_of_range(host, 10);
    CHECK(expected == (n > 3 ? n / 2 : n - 1));
    CHECK(gpu_backend().find_out_of_range(host.to(gpu()), 10) == expected);
  }
  CHECK(gpu_backend().find_out_of_range(Tensor::empty({0}, DType::I32, gpu()), 3) == -1);
}
