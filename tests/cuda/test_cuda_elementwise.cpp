// Elementwise maps, broadcasting, broadcast-reductions and the causal mask, CUDA against the
// CPU backend.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "backend_agreement.h"
#include "core/math/elementwise.h"
#include "cuda/kernels/cast.h"
#include "cuda/kernels/elementwise.h"
#include "cuda/cuda_backend.h"

namespace {

using namespace mixprec;
using namespace mixprec::cuda_test;

constexpr UnaryOp kUnaryOps[] = {UnaryOp::Exp,  UnaryOp::Log,  UnaryOp::Sqrt,    UnaryOp::Square,
                                 UnaryOp::Relu, UnaryOp::Gelu, UnaryOp::Sigmoid, UnaryOp::Tanh};
constexpr BinaryOp kBinaryOps[] = {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div};

// Inputs inside each op's domain: positive for log and sqrt, moderate for exp.
std::pair<float, float> input_range(UnaryOp op) {
  switch (op) {
    case UnaryOp::Log:
    case UnaryOp::Sqrt: return {0.05f, 4.0f};
    case UnaryOp::Exp: return {-3.0f, 3.0f};
    default: return {-4.0f, 4.0f};
  }
}

// Square and relu are exact in FP32, so their results must match bit for bit.
bool exact_op(UnaryOp op) { return op == UnaryOp::Square || op == UnaryOp::Relu; }

struct BroadcastCase {
  Shape a, b;
};

// Equal shapes, a one-element operand on either side (0-d included), a bias over the last
// dims, an outer product, and mixed patterns that keep several dims after merging.
const std::vector<BroadcastCase>& broadcast_cases() {
  static const std::vector<BroadcastCase> cases = {
      {{1023}, {1023}},       {{4097}, {1}},           {{}, {7, 3}},           {{1}, {1}},
      {{5, 7}, {7}},          {{33, 4097}, {4097}},    {{6, 1}, {1, 9}},       {{2, 3, 1, 5}, {3, 4, 1}},
      {{7, 1, 3}, {1, 5, 1}}, {{4, 1}, {4, 1023}},     {{3, 1, 1, 2}, {1, 4, 5, 1}}};
  return cases;
}

Tensor cpu_unary(UnaryOp op, const Tensor& x) {
  Tensor y = Tensor::empty(x.shape(), x.dtype());
  cpu_backend().unary(op, x, y);
  return y;
}

// For every element i, the sum of |x| over the elements that sum_to adds into y[i], times
// |scale|: the scale of the rounding error of a reduction.
std::vector<float> abs_sums(const Tensor& x, const Shape& y_shape, float scale) {
  std::vector<float> values = x.to_float_vector();
  for (float& v : values) v = std::fabs(v);
  const Tensor abs_x = Tensor::from_vector(values, x.shape(), DType::F32);
  Tensor sums = Tensor::empty(y_shape, DType::F32);
  cpu_backend().sum_to(abs_x, sums, std::fabs(scale));
  return sums.to_float_vector();
}

}  // namespace

TEST_CASE("cuda unary matches the CPU for every op, dtype and odd size", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(21);
  for (UnaryOp op : kUnaryOps) {
    const auto [low, high] = input_range(op);
    for (DType dtype : kFloatingTypes) {
      for (int64_t n : kOddSizes) {
        INFO("op " << static_cast<int>(op) << ", " << dtype << " [" << n << "]");
        const Tensor x = random_tensor({n}, dtype, rng, low, high);
        const Tensor expected = cpu_unary(op, x);
        Tensor actual = poisoned({n}, dtype);
        gpu_backend().unary(op, x.to(gpu()), actual);
        if (exact_op(op)) expect_bits_equal(expected, actual);
        else expect_close(expected, actual);
      }
    }
  }
}

TEST_CASE("cuda unary keeps NaN through relu and writes in place", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (DType dtype : kFloatingTypes) {
    const Tensor x = Tensor::from_vector({-1.0f, nan, 2.0f, -0.0f, 0.5f, -3.0f, nan}, {7}, dtype);
    Tensor y = x.to(gpu());
    gpu_backend().unary(UnaryOp::Relu, y, y);
    const std::vector<float> v = y.to_float_vector();
    CHECK(v[0] == 0.0f);
    CHECK(std::isnan(v[1]));
    CHECK(v[2] == 2.0f);
    CHECK(v[4] == 0.5f);
    CHECK(v[5] == 0.0f);
    CHECK(std::isnan(v[6]));
  }
}

TEST_CASE("cuda unary_backward matches the CPU for every op and dtype", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(22);
  for (UnaryOp op : kUnaryOps) {
    const auto [low, high] = input_range(op);
    for (DType dtype : kFloatingTypes) {
      for (int64_t n : kOddSizes) {
        INFO("op " << static_cast<int>(op) << ", " << dtype << " [" << n << "]");
        const Tensor x = random_tensor({n}, dtype, rng, low, high);
        const Tensor y = cpu_unary(op, x);
        const Tensor dy = random_tensor({n}, dtype, rng);
        Tensor expected = Tensor::empty({n}, dtype);
        cpu_backend().unary_backward(op, x, y, dy, expected);
        Tensor actual = poisoned({n}, dtype);
        gpu_backend().unary_backward(op, x.to(gpu()), y.to(gpu()), dy.to(gpu()), actual);
        if (op == UnaryOp::Relu) expect_bits_equal(expected, actual);
        else expect_close(expected, actual);
      }
    }
  }
}

TEST_CASE("cuda affine matches the CPU", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(23);
  for (DType dtype : kFloatingTypes) {
    for (int64_t n : kOddSizes) {
      INFO(dtype << " [" << n << "]");
      const Tensor x = random_tensor({n}, dtype, rng);
      Tensor expected = Tensor::empty({n}, dtype);
      cpu_backend().affine(x, -1.75f, 0.3f, expected);
      Tensor actual = poisoned({n}, dtype);
      gpu_backend().affine(x.to(gpu()), -1.75f, 0.3f, actual);
      expect_close(expected, actual);
    }
  }
}

TEST_CASE("cuda binary matches the CPU bit for bit under broadcasting", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(24);
  for (const BroadcastCase& c : broadcast_cases()) {
    const Shape out = broadcast_shapes(c.a, c.b, "test");
    for (BinaryOp op : kBinaryOps) {
      for (DType dtype : kFloatingTypes) {
        INFO("op " << static_cast<int>(op) << ", " << dtype << " " << shape_str(c.a) << " with "
                   << shape_str(c.b));
        const Tensor a = random_tensor(c.a, dtype, rng);
        // Divisors away from zero.
        const Tensor b = random_tensor(c.b, dtype, rng, 0.5f, 2.0f);
        // One IEEE operation on both sides, then one rounding: the same bits.
        Tensor expected = Tensor::empty(out, dtype);
        cpu_backend().binary(op, a, b, expected);
        Tensor actual = poisoned(out, dtype);
        gpu_backend().binary(op, a.to(gpu()), b.to(gpu()), actual);
        expect_bits_equal(expected, actual);
        // Operands swapped, which puts a one-element operand on the other side.
        cpu_backend().binary(op, b, a, expected);
        poison(actual);
        gpu_backend().binary(op, b.to(gpu()), a.to(gpu()), actual);
        expect_bits_equal(expected, actual);
      }
    }
  }
}

TEST_CASE("cuda binary writes in place over an operand", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(25);
  for (DType dtype : kFloatingTypes) {
    const Tensor a = random_tensor({33, 65}, dtype, rng);
    const Tensor b = random_tensor({65}, dtype, rng);
    Tensor expected = Tensor::empty({33, 65}, dtype);
    cpu_backend().binary(BinaryOp::Mul, a, b, expected);
    Tensor inplace = a.to(gpu());
    gpu_backend().binary(BinaryOp::Mul, inplace, b.to(gpu()), inplace);
    expect_bits_equal(expected, inplace);
  }
}

TEST_CASE("cuda sum_to matches the CPU over kept and reduced dims", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(26);
  // (x, y): full sums, reductions over leading dims (innermost kept, with and without
  // several splits), over trailing dims (innermost reduced, with and without splits), mixed
  // patterns, and the plain copy when nothing is reduced.
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{4097}, {1}},           {{4097}, {}},           {{1, 70000}, {1}},       {{7, 1023}, {1023}},
      {{300, 257}, {257}},     {{2000, 3}, {3}},       {{7, 1023}, {7, 1}},     {{4, 20000}, {4, 1}},
      {{33, 65, 7}, {65, 1}},  {{3, 4, 5}, {3, 1, 5}}, {{5, 1, 7}, {1, 7}},     {{2, 3}, {2, 3}},
      {{6, 5, 4, 3}, {5, 1, 3}}};
  for (const auto& [xs, ys] : cases) {
    for (DType dtype : kFloatingTypes) {
      INFO(dtype << " " << shape_str(xs) << " -> " << shape_str(ys));
      const Tensor x = random_tensor(xs, dtype, rng);
      const float scale = 0.5f;
      Tensor expected = Tensor::empty(ys, dtype);
      cpu_backend().sum_to(x, expected, scale);
      Tensor actual = poisoned(ys, dtype);
      gpu_backend().sum_to(x.to(gpu()), actual, scale);
      // Summation orders differ: the error is relative to the sum of magnitudes.
      expect_close(expected, actual, tolerance_for(dtype), abs_sums(x, ys, scale));

      // The same shapes give the same bits on every run.
      Tensor again = poisoned(ys, dtype);
      gpu_backend().sum_to(x.to(gpu()), again, scale);
      expect_bits_equal(actual, again);
    }
  }
  // Nothing to sum: zeros.
  Tensor empty_sum = poisoned({3}, DType::F32);
  gpu_backend().sum_to(Tensor::empty({0, 3}, DType::F32, gpu()), empty_sum, 1.0f);
  CHECK(empty_sum.to_float_vector() == std::vector<float>{0.0f, 0.0f, 0.0f});
}

TEST_CASE("cuda expand matches the CPU bit for bit", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(27);
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{1}, {4097}},       {{}, {5}},          {{1023}, {7, 1023}}, {{7, 1}, {7, 1023}},
      {{3, 1, 5}, {2, 3, 4, 5}}, {{7}, {7}},   {{1, 4, 1}, {3, 4, 9}}};
  for (const auto& [xs, ys] : cases) {
    for (DType dtype : kFloatingTypes) {
      INFO(dtype << " " << shape_str(xs) << " -> " << shape_str(ys));
      const Tensor x = random_tensor(xs, dtype, rng);
      expect_backends_agree_bitwise(ys, dtype, [&](Backend& backend, Device device, Tensor& out) {
        backend.expand(x.to(device), out, -1.5f);
      });
    }
  }
}

TEST_CASE("cuda causal_mask matches the CPU, in place too", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(28);
  const std::vector<Shape> shapes = {{1, 1}, {7, 7}, {3, 5, 9}, {2, 9, 4}, {2, 2, 33, 33}};
  for (const Shape& shape : shapes) {
    for (DType dtype : kFloatingTypes) {
      for (float fill : {-std::numeric_limits<float>::infinity(), -1e4f}) {
        INFO(dtype << " " << shape_str(shape) << " fill " << fill);
        const Tensor x = random_tensor(shape, dtype, rng);
        Tensor expected = Tensor::empty(shape, dtype);
        cpu_backend().causal_mask(x, fill, expected);
        Tensor actual = poisoned(shape, dtype);
        gpu_backend().causal_mask(x.to(gpu()), fill, actual);
        expect_bits_equal(expected, actual);
        Tensor inplace = x.to(gpu());
        gpu_backend().causal_mask(inplace, fill, inplace);
        expect_bits_equal(expected, inplace);
      }
    }
  }
}

TEST_CASE("cuda elementwise kernels handle misaligned data with scalar loads", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  // Tensors are always 256-byte aligned; the kernels' scalar path is reached by offsetting
  // raw pointers one element into the buffers.
  auto& backend = dynamic_cast<CudaBackend&>(gpu_backend());
  std::mt19937 rng(29);
  for (DType dtype : kFloatingTypes) {
    for (int64_t n : kOddSizes) {
      INFO(dtype << " [" << n << "]");
      const Tensor x = random_tensor({n + 1}, dtype, rng);
      const size_t esize = dtype_size(dtype);
      const Tensor xg = x.to(gpu());
      Tensor y = poisoned({n + 1}, dtype);
      kernels::unary(UnaryOp::Square, dtype, static_cast<const unsigned char*>(xg.data()) + esize,
                     static_cast<unsigned char*>(y.data()) + esize, n, backend.stream());
      const Tensor expected = cpu_unary(UnaryOp::Square, x);
      const std::vector<uint32_t> e = element_bits(expected), a = element_bits(y);
      CHECK(a[0] == poison_bits(dtype));  // the element before the range is untouched
      CHECK(std::vector<uint32_t>(e.begin() + 1, e.end()) == std::vector<uint32_t>(a.begin() + 1, a.end()));

      if (dtype == DType::F32) continue;
      // Widening is exact, so the F32 results equal the source values.
      Tensor f32 = poisoned({n + 1}, DType::F32);
      kernels::cast(static_cast<const unsigned char*>(xg.data()) + esize, dtype,
                    static_cast<float*>(f32.data()) + 1, DType::F32, n, backend.stream());
      const std::vector<float> widened = f32.to_float_vector(), source = x.to_float_vector();
      CHECK(std::vector<float>(widened.begin() + 1, widened.end()) ==
            std::vector<float>(source.begin() + 1, source.end()));
    }
  }
}
