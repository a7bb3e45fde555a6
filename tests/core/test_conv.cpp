// conv2d: forward against a direct (seven-loop) convolution in double, the gradients the op
// table (tests/ops/op_table.h) does not draw, FP16/BF16 against FP32 over longer sums, and
// input validation.
#include <catch2/catch.hpp>
#include <omp.h>

#include <cmath>
#include <vector>

#include "core/autograd/grad_mode.h"
#include "core/backend.h"
#include "gradcheck.h"

namespace {

using namespace mixprec;
using namespace mixprec::testing;

// y[n][o][i][j] = b[o] + sum_{c,p,q} x[n][c][i*s - pad + p][j*s - pad + q] * w[o][c][p][q].
std::vector<double> reference_conv(const Tensor& x, const Tensor& w, const Tensor& bias,
                                   int64_t stride, int64_t pad, Shape& out_shape) {
  const std::vector<float> vx = x.to_float_vector(), vw = w.to_float_vector();
  const std::vector<float> vb = bias.defined() ? bias.to_float_vector() : std::vector<float>();
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), wd = x.size(3);
  const int64_t o = w.size(0), kh = w.size(2), kw = w.size(3);
  const int64_t oh = (h + 2 * pad - kh) / stride + 1, ow = (wd + 2 * pad - kw) / stride + 1;
  out_shape = {n, o, oh, ow};
  std::vector<double> y(static_cast<size_t>(n * o * oh * ow));
  for (int64_t in = 0; in < n; ++in)
    for (int64_t io = 0; io < o; ++io)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          double s = vb.empty() ? 0.0 : vb[io];
          for (int64_t ic = 0; ic < c; ++ic)
            for (int64_t p = 0; p < kh; ++p)
              for (int64_t q = 0; q < kw; ++q) {
                const int64_t r = i * stride - pad + p, col = j * stride - pad + q;
                if (r < 0 || r >= h || col < 0 || col >= wd) continue;
                s += static_cast<double>(vx[((in * c + ic) * h + r) * wd + col]) *
                     vw[((io * c + ic) * kh + p) * kw + q];
              }
          y[((in * o + io) * oh + i) * ow + j] = s;
        }
  return y;
}

void check_against_reference(const Tensor& x, const Tensor& w, const Tensor& bias, int64_t stride,
                             int64_t pad) {
  Shape shape;
  const std::vector<double> expected = reference_conv(x, w, bias, stride, pad, shape);
  const Tensor y = ops::conv2d(x, w, bias, stride, pad);
  REQUIRE(y.shape() == shape);
  require_matches(y, expected, 1e-5, "conv2d");
}

}  // namespace

TEST_CASE("conv2d: forward matches a direct convolution", "[gemm]") {
  SECTION("3x3, padding 1, stride 1, batch of 3") {
    check_against_reference(random_tensor({3, 4, 7, 9}, 1), random_tensor({5, 4, 3, 3}, 2),
                            random_tensor({5}, 3), 1, 1);
  }
  SECTION("non-square 3x2 kernel, stride 2, no padding, no bias, one image") {
    check_against_reference(random_tensor({1, 2, 13, 7}, 4), random_tensor({3, 2, 3, 2}, 5),
                            Tensor(), 2, 0);
  }
  SECTION("1x1 kernel, stride 3, padding 2") {
    check_against_reference(random_tensor({2, 3, 5, 5}, 6), random_tensor({4, 3, 1, 1}, 7),
                            random_tensor({4}, 8), 3, 2);
  }
  SECTION("kernel as large as the padded input gives a 1x1 output") {
    check_against_reference(random_tensor({2, 1, 3, 3}, 9), random_tensor({2, 1, 5, 5}, 10),
                            random_tensor({2}, 11), 1, 1);
  }
}

// Only the bias needs a gradient, which the op table (every input differentiable) does not
// draw.
TEST_CASE("conv2d: the bias gradient alone matches finite differences", "[gemm]") {
  const Tensor x = random_tensor({2, 2, 4, 4}, 27);
  const Tensor w = random_tensor({3, 2, 2, 2}, 28);
  Tensor b = random_tensor({3}, 29).set_requires_grad(true);
  gradcheck("conv2d bias only",
            [](const std::vector<Tensor>& in) { return ops::conv2d(in[0], in[1], in[2], 2, 1); },
            {x, w, b});
}

TEST_CASE("conv2d: filter gradient sums over a batch larger than the thread count", "[gemm]") {
  // dW = sum_n dy[n] (x) x[n]: with dy = 1 and a 1x1 kernel, dW[o][c] = sum of x over n, h, w.
  const Tensor x = random_tensor({9, 3, 4, 5}, 35);
  Tensor w = random_tensor({2, 3, 1, 1}, 36).set_requires_grad(true);
  Tensor b = random_tensor({2}, 37).set_requires_grad(true);
  ops::conv2d(x, w, b).backward(Tensor::ones({9, 2, 4, 5}));
  const std::vector<float> vx = x.to_float_vector();
  for (int64_t c = 0; c < 3; ++c) {
    double s = 0;
    for (int64_t n = 0; n < 9; ++n)
      for (int64_t i = 0; i < 20; ++i) s += vx[(n * 3 + c) * 20 + i];
    CHECK(w.grad().get(c) == Approx(s).epsilon(1e-5));
    CHECK(w.grad().get(3 + c) == Approx(s).epsilon(1e-5));
  }
  CHECK(b.grad().get(0) == 9 * 20);
  CHECK(b.grad().get(1) == 9 * 20);
}

TEST_CASE("conv2d: filter gradient inside an OpenMP parallel region", "[gemm]") {
  // With one image the kernel runs serially on the calling thread, whose thread number in
  // the enclosing team (up to 3 here) must not pick the FP32 partial sum: only one exists.
  for (int64_t batch : {1, 3}) {
    const Tensor x = random_tensor({batch, 4, 16, 16}, 38);
    const Tensor w = random_tensor({64, 4, 3, 3}, 39);
    const auto filter_grad = [&] {
      Tensor w2 = w.clone();
      w2.set_requires_grad(true);
      ops::sum(ops::conv2d(x, w2, Tensor(), 1, 1)).backward();
      return w2.grad().to_float_vector();
    };
    const std::vector<float> expected = filter_grad();
    constexpr int kThreads = 4;
    std::vector<std::vector<float>> got(kThreads);
#pragma omp parallel num_threads(kThreads)
    got[static_cast<size_t>(omp_get_thread_num())] = filter_grad();
    for (int t = 0; t < kThreads; ++t) {
      INFO("batch " << batch << ", thread " << t);
      const std::vector<float>& g = got[static_cast<size_t>(t)];
      REQUIRE(g.size() == expected.size());
      // Batch 3 may add its per-image partials in another order than outside the region.
      int64_t bad = 0;
      for (size_t i = 0; i < g.size(); ++i)
        bad += std::abs(g[i] - expected[i]) <= 1e-5f * (1 + std::abs(expected[i])) ? 0 : 1;
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("conv2d: FP16/BF16 forward and backward", "[gemm]") {
  const Tensor x = random_tensor({2, 3, 8, 8}, 41);
  const Tensor w = random_tensor({4, 3, 3, 3}, 42, -0.5f, 0.5f);
  const Tensor b = random_tensor({4}, 43);
  const auto f = [](const std::vector<Tensor>& in) {
    return ops::conv2d(in[0], in[1], in[2], 1, 1);
  };
  for (DType dtype : {DType::F16, DType::BF16}) {
    check_low_precision("conv2d", f, {x, w, b}, dtype, 4.0);

    const double rtol = low_precision_rtol(dtype);
    check_low_precision_grads("conv2d", f, {x, w, b}, random_tensor({2, 4, 8, 8}, 44), dtype,
                              rtol, {4 * rtol, 10 * rtol, 10 * rtol});
  }
}

TEST_CASE("conv2d: bad inputs name the op, shapes and dtypes", "[gemm]") {
  const Tensor x = Tensor::zeros({2, 3, 5, 5});
  const Tensor w = Tensor::zeros({4, 3, 3, 3});
  REQUIRE_THROWS_WITH(ops::conv2d(Tensor::zeros({3, 5, 5}), w),
                      Catch::Contains("conv2d") && Catch::Contains("F32[3, 5, 5]") &&
                          Catch::Contains("4 dimensions"));
  REQUIRE_THROWS_WITH(
      ops::conv2d(x, Tensor::zeros({4, 3, 3})),
      Catch::Contains("conv2d") && Catch::Contains("weight") && Catch::Contains("F32[4, 3, 3]"));
  REQUIRE_THROWS_WITH(ops::conv2d(x, Tensor::zeros({4, 2, 3, 3})),
                      Catch::Contains("conv2d") && Catch::Contains("channels") &&
                          Catch::Contains("F32[4, 2, 3, 3]"));
  REQUIRE_THROWS_WITH(ops::conv2d(x, w, Tensor::zeros({3})), Catch::Contains("conv2d") &&
                                                                 Catch::Contains("bias") &&
                                                                 Catch::Contains("[4]"));
  REQUIRE_THROWS_WITH(ops::conv2d(x, Tensor::zeros({4, 3, 7, 7})),
                      Catch::Contains("conv2d") && Catch::Contains("larger than the padded input"));
  REQUIRE_THROWS_WITH(ops::conv2d(x, w, Tensor(), 0),
                      Catch::Contains("conv2d") && Catch::Contains("stride"));
  REQUIRE_THROWS_WITH(ops::conv2d(x, w, Tensor(), 1, -1),
                      Catch::Contains("conv2d") && Catch::Contains("padding"));
  REQUIRE_THROWS_WITH(ops::conv2d(x, w.to(DType::F16)), Catch::Contains("conv2d") &&
                                                            Catch::Contains("F16[4, 3, 3, 3]") &&
                                                            Catch::Contains("dtype"));
  REQUIRE_THROWS_WITH(
      ops::conv2d(Tensor::zeros({2, 3, 5, 5}, DType::I32), Tensor::zeros({4, 3, 3, 3}, DType::I32)),
      Catch::Contains("conv2d") && Catch::Contains("I32[2, 3, 5, 5]"));
  REQUIRE_THROWS_WITH(ops::conv2d(Tensor(), w),
                      Catch::Contains("conv2d") && Catch::Contains("undefined"));
  REQUIRE_THROWS_WITH(ops::conv2d(Tensor::zeros({0, 3, 5, 5}), w),
                      Catch::Contains("conv2d") && Catch::Contains("empty"));
}
