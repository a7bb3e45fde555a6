// max_pool2d and avg_pool2d: forwards against direct loops (PyTorch semantics: max ignores
// padding, avg counts it) and input validation; their gradients and F16/BF16 results are the
// op table's (tests/ops/op_table.h).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/autograd/grad_mode.h"
#include "core/backend.h"
#include "core/math/pool.h"
#include "gradcheck.h"

namespace {

using namespace mixprec;
using namespace mixprec::testing;

std::vector<double> reference_pool(const Tensor& x, bool is_max, int64_t k, int64_t s, int64_t p,
                                   Shape& out_shape) {
  const std::vector<float> vx = x.to_float_vector();
  const int64_t planes = x.size(0) * x.size(1), h = x.size(2), w = x.size(3);
  const int64_t oh = (h + 2 * p - k) / s + 1, ow = (w + 2 * p - k) / s + 1;
  out_shape = {x.size(0), x.size(1), oh, ow};
  std::vector<double> y;
  for (int64_t pl = 0; pl < planes; ++pl)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        double best = -std::numeric_limits<double>::infinity(), sum = 0;
        for (int64_t a = 0; a < k; ++a)
          for (int64_t b = 0; b < k; ++b) {
            const int64_t r = i * s - p + a, c = j * s - p + b;
            if (r < 0 || r >= h || c < 0 || c >= w) continue;  // padding: -inf / 0
            const double v = vx[(pl * h + r) * w + c];
            best = std::max(best, v);
            sum += v;
          }
        y.push_back(is_max ? best : sum / static_cast<double>(k * k));
      }
  return y;
}

void check_pool(const Tensor& x, bool is_max, int64_t k, int64_t s, int64_t p) {
  Shape shape;
  const std::vector<double> expected = reference_pool(x, is_max, k, s, p, shape);
  const Tensor y = is_max ? ops::max_pool2d(x, k, s, p) : ops::avg_pool2d(x, k, s, p);
  REQUIRE(y.shape() == shape);
  const std::vector<float> got = y.to_float_vector();
  for (size_t i = 0; i < got.size(); ++i) {
    INFO((is_max ? "max" : "avg") << " k" << k << " s" << s << " p" << p << " element " << i);
    CHECK(got[i] == Approx(expected[i]).epsilon(1e-6).margin(1e-6));
  }
}

}  // namespace

TEST_CASE("pool2d: forward matches direct loops", "[gemm]") {
  const Tensor x = random_tensor({2, 3, 7, 6}, 1);
  for (bool is_max : {true, false}) {
    check_pool(x, is_max, 2, 2, 0);
    check_pool(x, is_max, 3, 2, 1);  // overlapping windows with padding
    check_pool(x, is_max, 3, 1, 1);
    check_pool(x, is_max, 1, 3, 0);
    check_pool(x, is_max, 4, 3, 2);
  }
}

TEST_CASE("pool2d: stride -1 means the kernel size", "[gemm]") {
  const Tensor x = random_tensor({1, 2, 9, 7}, 2);
  CHECK(ops::max_pool2d(x, 3).shape() == Shape{1, 2, 3, 2});
  CHECK(ops::avg_pool2d(x, 2).shape() == Shape{1, 2, 4, 3});
}

TEST_CASE("pool2d: avg counts padded cells in the divisor", "[gemm]") {
  // Corner window of a 3x3 kernel with padding 1 covers 4 real cells of ones: 4 / 9.
  const Tensor x = Tensor::ones({1, 1, 4, 4});
  const Tensor y = ops::avg_pool2d(x, 3, 1, 1);
  CHECK(y.get(0) == Approx(4.0 / 9.0));
  CHECK(y.get(5) == Approx(1.0));
}

TEST_CASE("pool2d: max pooling propagates NaN and routes the gradient to the argmax", "[gemm]") {
  std::vector<float> v = {1, 5, 2, 0, 3, 2, std::nanf(""), 4, 7, 6, 9, 8, -2, -3, -4, -5};
  const Tensor x = Tensor::from_vector(v, {1, 1, 4, 4});
  const Tensor y = ops::max_pool2d(x, 2);
  CHECK(y.get(0) == 5.0);
  CHECK(std::isnan(y.get(1)));
  CHECK(y.get(2) == 7.0);
  CHECK(y.get(3) == 9.0);

  Tensor x2 =
      Tensor::from_vector({1, 5, 2, 0, 3, 2, -1, 4, 7, 6, 9, 8, -2, -3, -4, -5}, {1, 1, 4, 4})
          .set_requires_grad(true);
  ops::max_pool2d(x2, 2).backward(Tensor::from_vector({10, 20, 30, 40}, {1, 1, 2, 2}));
  const std::vector<float> expected = {0, 10, 0, 0, 0, 0, 0, 20, 30, 0, 40, 0, 0, 0, 0, 0};
  CHECK(x2.grad().to_float_vector() == expected);
}

// The window rules of core/math/pool.h, which the CUDA kernels share: checked directly,
// including the cases the op tests avoid (ties, several NaNs, an all-padding window).
TEST_CASE("pool2d math: max window rule, spans and divisor", "[gemm]") {
  MaxPoolArg tie;
  for (int64_t i = 0; i < 4; ++i) tie.offer(i % 2 == 0 ? 3.0f : 1.0f, i);
  CHECK(tie.value == 3.0f);
  CHECK(tie.index == 0);

  const float minus_nan = -std::numeric_limits<float>::quiet_NaN();
  MaxPoolArg nan;
  nan.offer(1.0f, 0);
  CHECK_FALSE(nan.settled());
  nan.offer(minus_nan, 1);
  nan.offer(std::numeric_limits<float>::quiet_NaN(), 2);
  nan.offer(std::numeric_limits<float>::infinity(), 3);
  CHECK(nan.settled());
  CHECK(std::isnan(nan.value));
  CHECK(std::signbit(nan.value));
  CHECK(nan.index == 1);

  MaxPoolArg lowest;
  lowest.offer(-std::numeric_limits<float>::infinity(), 7);
  CHECK(lowest.index == 7);

  const MaxPoolArg empty;
  CHECK(empty.value == -std::numeric_limits<float>::infinity());
  CHECK(empty.index == -1);

  CHECK(window_output_size(7, 3, 2, 1) == 4);
  CHECK(window_output_size(4, 2, 2, 0) == 2);
  CHECK(window_output_size(5, 2, 2, 0) == 2);
  const PoolSpan first = pool_span(0, 7, 3, 2, 1);
  CHECK((first.begin == 0 && first.end == 2));
  const PoolSpan last = pool_span(3, 7, 3, 2, 1);
  CHECK((last.begin == 5 && last.end == 7));
  const PoolSpan padding_only = pool_span(0, 4, 3, 1, 3);
  CHECK(padding_only.begin >= padding_only.end);

  CHECK(avg_pool_inv_divisor(3, 2) == 1.0f / 6.0f);
}

TEST_CASE("pool2d: bad inputs name the op, shapes and dtypes", "[gemm]") {
  const Tensor x = Tensor::zeros({2, 3, 6, 6});
  REQUIRE_THROWS_WITH(ops::max_pool2d(Tensor::zeros({3, 6, 6}), 2),
                      Catch::Contains("max_pool2d") && Catch::Contains("F32[3, 6, 6]"));
  REQUIRE_THROWS_WITH(ops::avg_pool2d(x, 3, 1, 2), Catch::Contains("avg_pool2d") &&
                                                       Catch::Contains("padding") &&
                                                       Catch::Contains("kernel / 2"));
  REQUIRE_THROWS_WITH(ops::max_pool2d(x, 0),
                      Catch::Contains("max_pool2d") && Catch::Contains("kernel"));
  REQUIRE_THROWS_WITH(ops::max_pool2d(x, 2, 0),
                      Catch::Contains("max_pool2d") && Catch::Contains("stride"));
  REQUIRE_THROWS_WITH(ops::avg_pool2d(x, 2, 1, -1),
                      Catch::Contains("avg_pool2d") && Catch::Contains("padding"));
  REQUIRE_THROWS_WITH(ops::max_pool2d(x, 7), Catch::Contains("max_pool2d") &&
                                                 Catch::Contains("F32[2, 3, 6, 6]") &&
                                                 Catch::Contains("larger"));
  REQUIRE_THROWS_WITH(ops::avg_pool2d(Tensor::zeros({2, 3, 6, 6}, DType::I32), 2),
                      Catch::Contains("avg_pool2d") && Catch::Contains("I32[2, 3, 6, 6]"));
  REQUIRE_THROWS_WITH(ops::max_pool2d(Tensor(), 2),
                      Catch::Contains("max_pool2d") && Catch::Contains("undefined"));
  REQUIRE_THROWS_WITH(ops::avg_pool2d(Tensor::zeros({2, 0, 6, 6}), 2),
                      Catch::Contains("avg_pool2d") && Catch::Contains("empty"));
}
