// Broadcasting, broadcast reductions, expansion, permutation, narrow copies and the row
// kernels (softmax, layer norm) on shapes drawn at random (a fixed seed, so a failure repeats), CUDA against the CPU backend: the
// fixed cases of the other files pick the patterns their authors thought of, these the ones
// nobody did (ranks 0 to 5, extents of 1 anywhere, runs of kept and broadcast dims that
// merge or do not, odd sizes that leave vector tails).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "backend_agreement.h"

namespace mixprec::cuda_test {
namespace {

constexpr int kCases = 40;

// A shape of rank 0 to max_rank, extents mostly 1 to 9, now and then up to 40.
Shape random_shape(std::mt19937& rng, int max_rank) {
  std::uniform_int_distribution<int> rank(0, max_rank), small(1, 9), large(10, 40), pick(0, 7);
  Shape shape(static_cast<size_t>(rank(rng)));
  for (int64_t& extent : shape) extent = pick(rng) == 0 ? large(rng) : small(rng);
  return shape;
}

// A shape that broadcasts to `full`: some leading dims dropped, some others set to 1.
Shape broadcast_operand(const Shape& full, std::mt19937& rng) {
  std::uniform_int_distribution<size_t> dropped(0, full.size());
  std::bernoulli_distribution to_one(0.4);
  Shape shape(full.begin() + static_cast<std::ptrdiff_t>(dropped(rng)), full.end());
  for (int64_t& extent : shape)
    if (to_one(rng)) extent = 1;
  return shape;
}

std::string case_label(int index, const Shape& a, const Shape& b, DType dtype) {
  return "case " + std::to_string(index) + ": " + shape_str(a) + " and " + shape_str(b) + ", " +
         std::string(dtype_name(dtype));
}

TEST_CASE("cuda binary matches the CPU on random broadcast shapes", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(101);
  const BinaryOp ops[] = {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div};
  for (int index = 0; index < kCases; ++index) {
    const Shape out = random_shape(rng, 5);
    const Shape sa = broadcast_operand(out, rng), sb = broadcast_operand(out, rng);
    // The result's shape is out only where some operand keeps each of its extents.
    const Shape result = broadcast_shapes(sa, sb, "test");
    for (DType dtype : kFloatingTypes) {
      INFO(case_label(index, sa, sb, dtype));
      const Tensor a = random_tensor(sa, dtype, rng);
      const Tensor b = random_tensor(sb, dtype, rng, 0.5f, 2.0f);
      const Tensor ga = a.to(gpu()), gb = b.to(gpu());
      for (const BinaryOp op : ops) {
        INFO("op " << static_cast<int>(op));
        expect_backends_agree_bitwise(result, dtype, [&](Backend& backend, Device device,
                                                         Tensor& out) {
          backend.binary(op, device.is_cpu() ? a : ga, device.is_cpu() ? b : gb, out);
        });
      }
    }
  }
}

TEST_CASE("cuda sum_to and expand match the CPU on random broadcast shapes", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(102);
  for (int index = 0; index < kCases; ++index) {
    const Shape xs = random_shape(rng, 5);
    const Shape ys = broadcast_operand(xs, rng);
    for (DType dtype : kFloatingTypes) {
      INFO(case_label(index, xs, ys, dtype));
      const Tensor x = random_tensor(xs, dtype, rng);
      // sum_to: summation orders differ, so within the dtype's tolerance of the magnitudes.
      Tensor sums = Tensor::empty(ys, dtype);
      cpu_backend().sum_to(x, sums, 0.75f);
      Tensor gpu_sums = poisoned(ys, dtype);
      gpu_backend().sum_to(x.to(gpu()), gpu_sums, 0.75f);
      Tensor magnitudes = Tensor::empty(ys, DType::F32);
      cpu_backend().sum_to(abs_of(x), magnitudes, 0.75f);
      expect_close(sums, gpu_sums, tolerance_for(dtype), magnitudes.to_float_vector());
      // expand: one product and one rounding, the same bits.
      const Tensor small = random_tensor(ys, dtype, rng);
      expect_backends_agree_bitwise(xs, dtype, [&](Backend& backend, Device device, Tensor& out) {
        backend.expand(small.to(device), out, -1.25f);
      });
    }
  }
}

TEST_CASE("cuda permute and copy_narrow match the CPU on random shapes", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(103);
  const DType dtypes[] = {DType::F32, DType::F16, DType::BF16, DType::I32};
  for (int index = 0; index < kCases; ++index) {
    Shape xs = random_shape(rng, 5);
    if (xs.empty()) xs = {3};
    std::vector<int64_t> perm(xs.size());
    std::iota(perm.begin(), perm.end(), int64_t{0});
    std::shuffle(perm.begin(), perm.end(), rng);
    Shape ys(xs.size());
    for (size_t d = 0; d < xs.size(); ++d) ys[d] = xs[static_cast<size_t>(perm[d])];
    // A narrow copy along a random dim into a destination longer along it.
    std::uniform_int_distribution<size_t> dim_of(0, xs.size() - 1);
    const auto dim = static_cast<int64_t>(dim_of(rng));
    const int64_t extent = xs[static_cast<size_t>(dim)];
    std::uniform_int_distribution<int64_t> start_of(0, extent - 1), extra_of(0, 5);
    const int64_t src_start = start_of(rng);
    const int64_t length = std::uniform_int_distribution<int64_t>(0, extent - src_start)(rng);
    const int64_t dst_start = extra_of(rng);
    Shape ds = xs;
    ds[static_cast<size_t>(dim)] = dst_start + length + extra_of(rng);
    for (const DType dtype : dtypes) {
      INFO("case " << index << ": " << shape_str(xs) << " permuted, and narrowed along dim "
                   << dim << " from " << src_start << " for " << length << " into "
                   << shape_str(ds) << " at " << dst_start << ", " << dtype);
      const Tensor x = random_tensor(xs, DType::F32, rng, -100.0f, 100.0f).to(dtype);
      expect_backends_agree_bitwise(ys, dtype, [&](Backend& backend, Device device, Tensor& out) {
        backend.permute(x.to(device), perm, out);
      });

      // The destination's other elements are kept: both start from the same values.
      const Tensor before = random_tensor(ds, DType::F32, rng, -100.0f, 100.0f).to(dtype);
      Tensor narrowed = before.clone();
      cpu_backend().copy_narrow(x, dim, src_start, narrowed, dst_start, length);
      Tensor gpu_narrowed = before.to(gpu());
      gpu_backend().copy_narrow(x.to(gpu()), dim, src_start, gpu_narrowed, dst_start, length);
      expect_bits_equal(narrowed, gpu_narrowed);
    }
  }
}

// Rows of a random length (1 to 40, or now and then up to 5000, so that the row kernels'
// per-lane and per-block layouts all occur) under 0 to 3 random leading dims.
Shape random_rows(std::mt19937& rng) {
  std::uniform_int_distribution<int> pick(0, 3), small(1, 40), large(41, 5000);
  Shape shape = random_shape(rng, 3);
  // Few rows when they are long: the emulated device runs every thread on the CPU.
  const int64_t cols = pick(rng) == 0 ? large(rng) : small(rng);
  if (cols > 40) shape.resize(std::min<size_t>(shape.size(), 1));
  shape.push_back(cols);
  return shape;
}

TEST_CASE("cuda softmax, log-softmax and layer norm match the CPU on random row shapes",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(104);
  for (int index = 0; index < kCases; ++index) {
    const Shape shape = random_rows(rng);
    const int64_t cols = shape.back(), rows = shape_numel(shape) / cols;
    for (DType dtype : kFloatingTypes) {
      INFO("case " << index << ": " << shape_str(shape) << ", " << dtype);
      const Tensor x = random_tensor(shape, dtype, rng, -6.0f, 6.0f);
      const Tensor gx = x.to(gpu());
      for (const bool log : {false, true}) {
        INFO((log ? "log-softmax" : "softmax"));
        Tensor expected = Tensor::empty(shape, dtype);
        cpu_backend().softmax(x, expected, log);
        Tensor actual = poisoned(shape, dtype);
        gpu_backend().softmax(gx, actual, log);
        expect_close(expected, actual);
      }
      const Tensor w = random_tensor({cols}, dtype, rng, 0.5f, 1.5f);
      const Tensor b = random_tensor({cols}, dtype, rng);
      Tensor y = Tensor::empty(shape, dtype);
      Tensor mean = Tensor::empty({rows}, DType::F32), rstd = Tensor::empty({rows}, DType::F32);
      cpu_backend().layer_norm(x, &w, &b, 1e-5f, y, mean, rstd);
      const Tensor gw = w.to(gpu()), gb = b.to(gpu());
      Tensor gy = poisoned(shape, dtype);
      Tensor gmean = poisoned({rows}, DType::F32), grstd = poisoned({rows}, DType::F32);
      gpu_backend().layer_norm(gx, &gw, &gb, 1e-5f, gy, gmean, grstd);
      expect_close(y, gy);
      expect_close(mean, gmean, tolerance_for(DType::F32));
      expect_close(rstd, grstd, tolerance_for(DType::F32));
    }
  }
}

}  // namespace
}  // namespace mixprec::cuda_test
