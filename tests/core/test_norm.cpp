// layer_norm and batch_norm2d: forward against double references (batch norm's running
// statistics against a hand computation), layer norm's parameter gradients over many rows,
// and input validation; the gradients and F16/BF16 results of the op table's draws are its
// own (tests/ops/op_table.h).
#include <cmath>
#include <vector>

#include "core/autograd/grad_mode.h"
#include "fused_batch_norm_relu_check.h"
#include "gradcheck.h"

namespace mixprec {
namespace {

using Catch::Contains;
using namespace testing;

// ---- layer_norm ---------------------------------------------------------------------------

std::vector<double> reference_layer_norm(const std::vector<float>& x, int64_t cols,
                                         const std::vector<float>& w, const std::vector<float>& b,
                                         double eps) {
  std::vector<double> y(x.size());
  for (size_t r = 0; r < x.size() / cols; ++r) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < cols; ++j) mean += x[r * cols + j];
    mean /= cols;
    for (int64_t j = 0; j < cols; ++j) var += (x[r * cols + j] - mean) * (x[r * cols + j] - mean);
    var /= cols;  // biased
    for (int64_t j = 0; j < cols; ++j)
      y[r * cols + j] = (x[r * cols + j] - mean) / std::sqrt(var + eps) * (w.empty() ? 1.0 : w[j]) +
                        (b.empty() ? 0.0 : b[j]);
  }
  return y;
}

TEST_CASE("layer_norm matches a double reference", "[nn][layer_norm]") {
  for (const Shape& shape : {Shape{3, 7}, Shape{2, 3, 13}, Shape{4, 1}, Shape{5}}) {
    const int64_t d = shape.back();
    const Tensor x = random_tensor(shape, 3, -3.f, 5.f);
    const Tensor w = random_tensor({d}, 4, 0.5f, 1.5f), b = random_tensor({d}, 5);
    for (bool affine : {true, false}) {
      const Tensor y = affine ? ops::layer_norm(x, w, b, 1e-5) : ops::layer_norm(x, Tensor(), Tensor(), 0.1);
      const auto ref = reference_layer_norm(x.to_float_vector(), d,
                                            affine ? w.to_float_vector() : std::vector<float>{},
                                            affine ? b.to_float_vector() : std::vector<float>{},
                                            affine ? 1e-5 : 0.1);
      const std::vector<float> got = y.to_float_vector();
      for (size_t i = 0; i < ref.size(); ++i) REQUIRE(got[i] == Approx(ref[i]).margin(2e-5));
    }
  }
  // A large common offset does not cancel the variance (two-pass statistics).
  const Tensor shifted = Tensor::from_vector({1000.f, 1001.f, 1002.f, 1003.f}, {1, 4});
  const Tensor base = Tensor::from_vector({0.f, 1.f, 2.f, 3.f}, {1, 4});
  require_close(ops::layer_norm(shifted, Tensor(), Tensor()), ops::layer_norm(base, Tensor(), Tensor()),
                1e-5, 1e-5, "layer_norm offset");
}

// Many rows, more than the op table draws: the weight/bias gradients are summed over several
// row blocks.
TEST_CASE("layer_norm weight and bias gradients sum over several row blocks",
          "[nn][layer_norm]") {
  const Tensor x = random_tensor({70, 3}, 9, -2.f, 2.f);
  Tensor w = random_tensor({3}, 10, 0.5f, 1.5f).set_requires_grad(true);
  Tensor b = random_tensor({3}, 11).set_requires_grad(true);
  gradcheck("layer_norm weight over blocks",
            [&x](const std::vector<Tensor>& in) { return ops::layer_norm(x, in[0], in[1]); }, {w, b});
}

TEST_CASE("layer_norm rejects bad input", "[nn][layer_norm]") {
  const Tensor x = random_tensor({2, 5}, 1);
  REQUIRE_THROWS_WITH(ops::layer_norm(x, random_tensor({4}, 2), Tensor()),
                      Contains("layer_norm") && Contains("F32[4]") && Contains("F32[2, 5]"));
  REQUIRE_THROWS_WITH(ops::layer_norm(x, random_tensor({5}, 2, -1.f, 1.f, DType::F16), Tensor()),
                      Contains("layer_norm") && Contains("F16[5]"));
  REQUIRE_THROWS_WITH(ops::layer_norm(Tensor::from_ints({1, 2}, {2}), Tensor(), Tensor()),
                      Contains("layer_norm") && Contains("I32[2]"));
  REQUIRE_THROWS_WITH(ops::layer_norm(Tensor(), Tensor(), Tensor()),
                      Contains("layer_norm") && Contains("undefined"));
  REQUIRE_THROWS_WITH(ops::layer_norm(x, Tensor(), Tensor(), -1.0),
                      Contains("layer_norm") && Contains("eps"));
}

// ---- batch_norm2d -------------------------------------------------------------------------

struct ChannelStats {
  std::vector<double> mean, biased_var, unbiased_var;
};

ChannelStats reference_channel_stats(const Tensor& x) {
  const int64_t n = x.size(0), c = x.size(1), inner = x.size(2) * x.size(3);
  const std::vector<float> v = x.to_float_vector();
  ChannelStats s;
  for (int64_t ch = 0; ch < c; ++ch) {
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < inner; ++k) sum += v[(i * c + ch) * inner + k];
    const double count = static_cast<double>(n * inner), mean = sum / count;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < inner; ++k) {
        const double d = v[(i * c + ch) * inner + k] - mean;
        sq += d * d;
      }
    s.mean.push_back(mean);
    s.biased_var.push_back(sq / count);
    s.unbiased_var.push_back(sq / (count - 1));
  }
  return s;
}

void check_batch_norm_output(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b,
                             const std::vector<double>& mean, const std::vector<double>& var,
                             double eps) {
  const int64_t c = x.size(1), inner = x.size(2) * x.size(3);
  const std::vector<float> vx = x.to_float_vector(), vy = y.to_float_vector();
  for (size_t i = 0; i < vx.size(); ++i) {
    const int64_t ch = (static_cast<int64_t>(i) / inner) % c;
    const double ref = (vx[i] - mean[ch]) / std::sqrt(var[ch] + eps) * w.get(ch) + b.get(ch);
    REQUIRE(vy[i] == Approx(ref).margin(2e-5));
  }
}

TEST_CASE("batch_norm2d training normalises with batch statistics and updates running ones",
          "[nn][batch_norm]") {
  const Tensor x = random_tensor({4, 3, 5, 7}, 21, -1.f, 3.f);
  const Tensor w = random_tensor({3}, 22, 0.5f, 1.5f), b = random_tensor({3}, 23);
  Tensor running_mean = Tensor::from_vector({0.5f, -0.25f, 0.f}, {3});
  Tensor running_var = Tensor::from_vector({2.f, 1.f, 0.5f}, {3});
  const ChannelStats s = reference_channel_stats(x);

  const Tensor y = ops::batch_norm2d(x, w, b, running_mean, running_var, true, 0.1, 1e-5);
  check_batch_norm_output(y, x, w, b, s.mean, s.biased_var, 1e-5);
  const std::vector<double> rm0{0.5, -0.25, 0.0}, rv0{2.0, 1.0, 0.5};
  for (int64_t ch = 0; ch < 3; ++ch) {
    CHECK(running_mean.get(ch) == Approx(0.9 * rm0[ch] + 0.1 * s.mean[ch]).epsilon(1e-6));
    CHECK(running_var.get(ch) == Approx(0.9 * rv0[ch] + 0.1 * s.unbiased_var[ch]).epsilon(1e-6));
  }

  // A second step moves the running statistics again from where they are now.
  const std::vector<float> rm1 = running_mean.to_float_vector(), rv1 = running_var.to_float_vector();
  ops::batch_norm2d(x, w, b, running_mean, running_var, true, 0.5, 1e-5);
  for (int64_t ch = 0; ch < 3; ++ch) {
    CHECK(running_mean.get(ch) == Approx(0.5 * rm1[ch] + 0.5 * s.mean[ch]).epsilon(1e-6));
    CHECK(running_var.get(ch) == Approx(0.5 * rv1[ch] + 0.5 * s.unbiased_var[ch]).epsilon(1e-6));
  }
}

TEST_CASE("batch_norm2d statistics stay exact for a large mean over a small spread",
          "[nn][batch_norm]") {
  // Values 3e6 + [-1, 1] (multiples of 0.25 in FP32): E[x^2] - mean^2 would lose the variance
  // (about 0.33) to rounding even in double, by ~1e-3 relative; the statistics must match the
  // two-pass double reference to FP32 precision. Momentum 1 makes the running statistics the
  // batch's own.
  const Tensor x = random_tensor({4, 2, 6, 6}, 41, 3e6f - 1.0f, 3e6f + 1.0f);
  const ChannelStats s = reference_channel_stats(x);
  Tensor running_mean = Tensor::zeros({2}), running_var = Tensor::ones({2});
  ops::batch_norm2d(x, Tensor::ones({2}), Tensor::zeros({2}), running_mean, running_var, true,
                    1.0, 1e-5);
  for (int64_t ch = 0; ch < 2; ++ch) {
    CHECK(running_mean.get(ch) == Approx(s.mean[ch]).epsilon(1e-7));
    CHECK(running_var.get(ch) == Approx(s.unbiased_var[ch]).epsilon(1e-6));
  }
}

TEST_CASE("batch_norm2d eval uses the running statistics and leaves them alone",
          "[nn][batch_norm]") {
  const Tensor x = random_tensor({2, 3, 4, 3}, 24, -2.f, 2.f);
  const Tensor w = random_tensor({3}, 25, 0.5f, 1.5f), b = random_tensor({3}, 26);
  Tensor running_mean = Tensor::from_vector({0.5f, -0.25f, 0.f}, {3});
  Tensor running_var = Tensor::from_vector({2.f, 1.f, 0.5f}, {3});
  const Tensor y = ops::batch_norm2d(x, w, b, running_mean, running_var, false, 0.1, 1e-3);
  check_batch_norm_output(y, x, w, b, {0.5, -0.25, 0.0}, {2.0, 1.0, 0.5}, 1e-3);
  CHECK(running_mean.to_float_vector() == std::vector<float>{0.5f, -0.25f, 0.f});
  CHECK(running_var.to_float_vector() == std::vector<float>{2.f, 1.f, 0.5f});
}

TEST_CASE("batch_norm2d with relu fused is relu(batch_norm2d) bit for bit, forward and backward",
          "[nn][batch_norm]") {
  check_fused_batch_norm_relu(kCPU);
}

TEST_CASE("batch_norm2d rejects bad input", "[nn][batch_norm]") {
  const Tensor x = random_tensor({2, 3, 2, 2}, 1);
  const Tensor w = Tensor::ones({3}), b = Tensor::zeros({3});
  Tensor rm = Tensor::zeros({3}), rv = Tensor::ones({3});
  Tensor rm16 = Tensor::zeros({3}, DType::F16), rm4 = Tensor::zeros({4});
  REQUIRE_THROWS_WITH(ops::batch_norm2d(x, w, b, rm16, rv, true),
                      Contains("batch_norm2d") && Contains("running_mean") && Contains("F16[3]"));
  REQUIRE_THROWS_WITH(ops::batch_norm2d(x, w, b, rm, rm4, false),
                      Contains("batch_norm2d") && Contains("running_var") && Contains("F32[4]"));
  REQUIRE_THROWS_WITH(ops::batch_norm2d(random_tensor({2, 3, 4}, 1), w, b, rm, rv, true),
                      Contains("batch_norm2d") && Contains("F32[2, 3, 4]"));
  REQUIRE_THROWS_WITH(ops::batch_norm2d(x, Tensor::ones({2}), b, rm, rv, true),
                      Contains("batch_norm2d") && Contains("weight") && Contains("F32[2]"));
  REQUIRE_THROWS_WITH(ops::batch_norm2d(x, w.to(DType::BF16), b, rm, rv, true),
                      Contains("batch_norm2d") && Contains("BF16[3]"));
  REQUIRE_THROWS_WITH(ops::batch_norm2d(random_tensor({1, 3, 1, 1}, 1), w, b, rm, rv, true),
                      Contains("batch_norm2d") && Contains("more than one value"));
  REQUIRE_THROWS_WITH(ops::batch_norm2d(x, w, b, rm, rv, true, 1.5),
                      Contains("batch_norm2d") && Contains("momentum"));
  Tensor none;
  REQUIRE_THROWS_WITH(ops::batch_norm2d(x, w, b, none, rv, false),
                      Contains("batch_norm2d") && Contains("running_mean") && Contains("undefined"));
}

}  // namespace
}  // namespace mixprec
