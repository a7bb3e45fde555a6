// softmax and log_softmax: forward against a double-precision reference, stability on large
// inputs and input validation; gradients and F16/BF16 results are the op table's
// (tests/ops/op_table.h).
#include <cmath>
#include <vector>

#include "core/autograd/grad_mode.h"
#include "gradcheck.h"

namespace mixprec {
namespace {

using namespace testing;

// Softmax (or log-softmax) of each row of `x` (last dim `cols`), computed in double.
std::vector<double> reference_softmax(const std::vector<float>& x, int64_t cols, bool log) {
  std::vector<double> y(x.size());
  for (size_t r = 0; r < x.size() / cols; ++r) {
    double m = -INFINITY;
    for (int64_t j = 0; j < cols; ++j) m = std::max(m, (double)x[r * cols + j]);
    double s = 0;
    for (int64_t j = 0; j < cols; ++j) s += std::exp(x[r * cols + j] - m);
    for (int64_t j = 0; j < cols; ++j) {
      const double z = x[r * cols + j] - m;
      y[r * cols + j] = log ? z - std::log(s) : std::exp(z) / s;
    }
  }
  return y;
}

Tensor apply(bool log, const Tensor& x) { return log ? ops::log_softmax(x) : ops::softmax(x); }

TEST_CASE("softmax and log_softmax match a double reference", "[nn][softmax]") {
  for (bool log : {false, true}) {
    for (const Shape& shape : {Shape{3, 7}, Shape{2, 3, 13}, Shape{5, 1}, Shape{1}}) {
      const Tensor x = random_tensor(shape, 11 + shape.size(), -4.f, 4.f);
      const Tensor y = apply(log, x);
      REQUIRE(y.shape() == shape);
      REQUIRE(y.dtype() == DType::F32);
      const std::vector<double> ref = reference_softmax(x.to_float_vector(), shape.back(), log);
      const std::vector<float> got = y.to_float_vector();
      for (size_t i = 0; i < ref.size(); ++i) REQUIRE(got[i] == Approx(ref[i]).margin(1e-6));
    }
  }
}

TEST_CASE("softmax is stable for large inputs", "[nn][softmax]") {
  const Tensor big = Tensor::from_vector({1000.f, 1001.f, 1002.f, -1000.f, -1001.f, -1003.f}, {2, 3});
  const Tensor small = Tensor::from_vector({0.f, 1.f, 2.f, 3.f, 2.f, 0.f}, {2, 3});
  require_close(ops::softmax(big), ops::softmax(small), 1e-6, 1e-7, "softmax shift");
  require_close(ops::log_softmax(big), ops::log_softmax(small), 1e-6, 1e-6, "log_softmax shift");
  // A probability that underflows in softmax keeps its exact log in log_softmax.
  const Tensor wide = Tensor::from_vector({0.f, -200.f}, {1, 2});
  CHECK(ops::softmax(wide).get(1) == 0.0);
  CHECK(ops::log_softmax(wide).get(1) == Approx(-200.0).epsilon(1e-6));
}

TEST_CASE("softmax rejects bad input", "[nn][softmax]") {
  using Catch::Contains;
  const Tensor ids = Tensor::from_ints({1, 2, 3}, {3});
  REQUIRE_THROWS_WITH(ops::softmax(ids), Contains("softmax") && Contains("I32[3]"));
  REQUIRE_THROWS_WITH(ops::log_softmax(Tensor()), Contains("log_softmax") && Contains("undefined"));
  REQUIRE_THROWS_WITH(ops::softmax(Tensor::zeros({2, 0})),
                      Contains("softmax") && Contains("F32[2, 0]"));
  REQUIRE_THROWS_WITH(ops::softmax(Tensor::scalar(1.0)), Contains("softmax") && Contains("F32[]"));
}

}  // namespace
}  // namespace mixprec
