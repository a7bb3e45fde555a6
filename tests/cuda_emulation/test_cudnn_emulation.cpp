// The emulated cuDNN convolutions (cuda/emulation/cudnn_emulation.cpp) against cuDNN's
// documented semantics, for what the backend uses (cross-correlation, padding, stride): small
// convolutions worked by hand; batched problems against a direct evaluation of the
// definition, and the backward passes through the adjoint identities
//   <conv(x, w), dy> == <x, backward_data(dy, w)> == <w, backward_filter(x, dy)>
// on small integers (every sum exact in FP32); the alpha/beta blend with a NaN output and
// beta 0; one rounding after FP32 accumulation for 16-bit data, TF32 only when the math type
// allows it; and each descriptor refusal with the status cuDNN 9 returns. The emulated device
// memory is host memory, so the data live in host vectors.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <cudnn.h>

#include "core/half.h"
#include "emulation_test_util.h"

namespace {

using emulation_test::kNaN;

class Handle {
 public:
  Handle() { REQUIRE(cudnnCreate(&h_) == CUDNN_STATUS_SUCCESS); }
  ~Handle() { cudnnDestroy(h_); }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  cudnnHandle_t get() const { return h_; }

 private:
  cudnnHandle_t h_ = nullptr;
};

class TensorDesc {
 public:
  TensorDesc(cudnnDataType_t type, int n, int c, int h, int w) {
    REQUIRE(cudnnCreateTensorDescriptor(&d_) == CUDNN_STATUS_SUCCESS);
    REQUIRE(cudnnSetTensor4dDescriptor(d_, CUDNN_TENSOR_NCHW, type, n, c, h, w) ==
            CUDNN_STATUS_SUCCESS);
  }
  ~TensorDesc() { cudnnDestroyTensorDescriptor(d_); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
  cudnnTensorDescriptor_t get() const { return d_; }

 private:
  cudnnTensorDescriptor_t d_ = nullptr;
};

class FilterDesc {
 public:
  FilterDesc(cudnnDataType_t type, int k, int c, int r, int s) {
    REQUIRE(cudnnCreateFilterDescriptor(&d_) == CUDNN_STATUS_SUCCESS);
    REQUIRE(cudnnSetFilter4dDescriptor(d_, type, CUDNN_TENSOR_NCHW, k, c, r, s) ==
            CUDNN_STATUS_SUCCESS);
  }
  ~FilterDesc() { cudnnDestroyFilterDescriptor(d_); }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
  cudnnFilterDescriptor_t get() const { return d_; }

 private:
  cudnnFilterDescriptor_t d_ = nullptr;
};

struct Geometry {
  int pad = 0, stride = 1;
};

class ConvDesc {
 public:
  explicit ConvDesc(const Geometry& g, cudnnMathType_t math = CUDNN_FMA_MATH) {
    REQUIRE(cudnnCreateConvolutionDescriptor(&d_) == CUDNN_STATUS_SUCCESS);
    REQUIRE(cudnnSetConvolution2dDescriptor(d_, g.pad, g.pad, g.stride, g.stride, 1, 1,
                                            CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT) ==
            CUDNN_STATUS_SUCCESS);
    REQUIRE(cudnnSetConvolutionMathType(d_, math) == CUDNN_STATUS_SUCCESS);
  }
  ~ConvDesc() { cudnnDestroyConvolutionDescriptor(d_); }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
  cudnnConvolutionDescriptor_t get() const { return d_; }

 private:
  cudnnConvolutionDescriptor_t d_ = nullptr;
};

constexpr auto kFwd = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
constexpr auto kBwdData = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
constexpr auto kBwdFilter = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;

cudnnStatus_t forward(const Handle& h, float alpha, const TensorDesc& xd, const void* x,
                      const FilterDesc& wd, const void* w, const ConvDesc& cd, float beta,
                      const TensorDesc& yd, void* y) {
  return cudnnConvolutionForward(h.get(), &alpha, xd.get(), x, wd.get(), w, cd.get(), kFwd,
                                 nullptr, 0, &beta, yd.get(), y);
}

cudnnStatus_t backward_data(const Handle& h, float alpha, const FilterDesc& wd, const void* w,
                            const TensorDesc& dyd, const void* dy, const ConvDesc& cd, float beta,
                            const TensorDesc& dxd, void* dx) {
  return cudnnConvolutionBackwardData(h.get(), &alpha, wd.get(), w, dyd.get(), dy, cd.get(),
                                      kBwdData, nullptr, 0, &beta, dxd.get(), dx);
}

cudnnStatus_t backward_filter(const Handle& h, float alpha, const TensorDesc& xd, const void* x,
                              const TensorDesc& dyd, const void* dy, const ConvDesc& cd,
                              float beta, const FilterDesc& dwd, void* dw) {
  return cudnnConvolutionBackwardFilter(h.get(), &alpha, xd.get(), x, dyd.get(), dy, cd.get(),
                                        kBwdFilter, nullptr, 0, &beta, dwd.get(), dw);
}

std::string last_error() {
  char buffer[512] = {};
  cudnnGetLastErrorString(buffer, sizeof buffer);
  return buffer;
}

// The 3x3 image 1..9 and the 2x2 filter 1..4 of the hand-worked cases.
const std::vector<float> kImage = {1, 2, 3, 4, 5, 6, 7, 8, 9};
const std::vector<float> kFilter = {1, 2, 3, 4};

// One 1x1x3x3 image by one 1x1x2x2 filter, F32, into a poisoned output of `out` x `out`.
std::vector<float> convolve_3x3(const Geometry& g, int out) {
  Handle h;
  TensorDesc xd(CUDNN_DATA_FLOAT, 1, 1, 3, 3), yd(CUDNN_DATA_FLOAT, 1, 1, out, out);
  FilterDesc wd(CUDNN_DATA_FLOAT, 1, 1, 2, 2);
  ConvDesc cd(g);
  std::vector<float> y(out * out, kNaN);
  REQUIRE(forward(h, 1.0f, xd, kImage.data(), wd, kFilter.data(), cd, 0.0f, yd, y.data()) ==
          CUDNN_STATUS_SUCCESS);
  return y;
}

// ---- a direct evaluation of the definition, for the larger problems ---------------------------

struct Problem {
  int n, c, h, w, k, r, s;
  Geometry g;
  int p() const { return 1 + (h + 2 * g.pad - r) / g.stride; }
  int q() const { return 1 + (w + 2 * g.pad - s) / g.stride; }
};

// The input zero-padded by g.pad on every side; then y[n, k, p, q] = sum over the channels c
// and the taps (i, j) of padded[n, c, p * stride + i, q * stride + j] * w[k, c, i, j]. Sums in
// double; the integer data keep every value exact.
std::vector<double> reference_forward(const Problem& pb, const std::vector<float>& x,
                                      const std::vector<float>& w) {
  const int hp = pb.h + 2 * pb.g.pad, wp = pb.w + 2 * pb.g.pad;
  std::vector<double> padded(static_cast<size_t>(pb.n) * pb.c * hp * wp, 0.0);
  for (int n = 0; n < pb.n; ++n)
    for (int c = 0; c < pb.c; ++c)
      for (int i = 0; i < pb.h; ++i)
        for (int j = 0; j < pb.w; ++j)
          padded[((n * pb.c + c) * hp + i + pb.g.pad) * wp + j + pb.g.pad] =
              x[((n * pb.c + c) * pb.h + i) * pb.w + j];
  std::vector<double> y(static_cast<size_t>(pb.n) * pb.k * pb.p() * pb.q(), 0.0);
  for (int n = 0; n < pb.n; ++n)
    for (int k = 0; k < pb.k; ++k)
      for (int p = 0; p < pb.p(); ++p)
        for (int q = 0; q < pb.q(); ++q) {
          double sum = 0.0;
          for (int c = 0; c < pb.c; ++c)
            for (int i = 0; i < pb.r; ++i)
              for (int j = 0; j < pb.s; ++j)
                sum += padded[((n * pb.c + c) * hp + p * pb.g.stride + i) * wp +
                              q * pb.g.stride + j] *
                       w[((k * pb.c + c) * pb.r + i) * pb.s + j];
          y[((n * pb.k + k) * pb.p() + p) * pb.q() + q] = sum;
        }
  return y;
}

std::vector<float> small_integers(size_t count, std::mt19937& rng) {
  std::uniform_int_distribution<int> dist(-3, 3);
  std::vector<float> v(count);
  for (float& e : v) e = static_cast<float>(dist(rng));
  return v;
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double sum = 0.0;
  for (size_t i = 0; i < a.size(); ++i) sum += double{a[i]} * b[i];
  return sum;
}

}  // namespace

TEST_CASE("emulated cuDNN forward cross-correlation matches hand-worked numbers",
          "[cuda_emulation]") {
  // x = [1 2 3; 4 5 6; 7 8 9], w = [1 2; 3 4].
  // Cross-correlation: y[0][0] = 1*1 + 2*2 + 4*3 + 5*4 = 37, and so on.
  CHECK(convolve_3x3({}, 2) == std::vector<float>{37, 47, 67, 77});
  // Padding 1, stride 2: 1 + (3 + 2 - 2) / 2 = 2 outputs per axis, reading the padded rows and
  // columns {0, 1} and {2, 3}: [0 0; 0 1].w = 4, [0 0; 2 3].w = 18, [0 4; 0 7].w = 36,
  // [5 6; 8 9].w = 77.
  CHECK(convolve_3x3({.pad = 1, .stride = 2}, 2) == std::vector<float>{4, 18, 36, 77});

  // cudnnGetConvolution2dForwardOutputDim gives the same extents.
  TensorDesc xd(CUDNN_DATA_FLOAT, 1, 1, 3, 3);
  FilterDesc wd(CUDNN_DATA_FLOAT, 1, 1, 2, 2);
  ConvDesc strided({.pad = 1, .stride = 2});
  int n = 0, c = 0, hh = 0, ww = 0;
  REQUIRE(cudnnGetConvolution2dForwardOutputDim(strided.get(), xd.get(), wd.get(), &n, &c, &hh,
                                                &ww) == CUDNN_STATUS_SUCCESS);
  CHECK((n == 1 && c == 1 && hh == 2 && ww == 2));
}

TEST_CASE("emulated cuDNN backward passes match hand-worked numbers", "[cuda_emulation]") {
  Handle h;
  TensorDesc xd(CUDNN_DATA_FLOAT, 1, 1, 3, 3), yd(CUDNN_DATA_FLOAT, 1, 1, 2, 2);
  FilterDesc wd(CUDNN_DATA_FLOAT, 1, 1, 2, 2);
  const std::vector<float> ones(4, 1.0f);
  ConvDesc cd({});
  // With dy = 1 everywhere, dx[i][j] sums the filter taps that read x[i][j].
  std::vector<float> dx(9, kNaN);
  REQUIRE(backward_data(h, 1.0f, wd, kFilter.data(), yd, ones.data(), cd, 0.0f, xd, dx.data()) ==
          CUDNN_STATUS_SUCCESS);
  CHECK(dx == std::vector<float>{1, 1 + 2, 2, 1 + 3, 1 + 2 + 3 + 4, 2 + 4, 3, 3 + 4, 4});
  // dw[r][s] sums the x that tap (r, s) reads: x[0..1][0..1] for tap (0, 0), and so on.
  std::vector<float> dw(4, kNaN);
  REQUIRE(backward_filter(h, 1.0f, xd, kImage.data(), yd, ones.data(), cd, 0.0f, wd, dw.data()) ==
          CUDNN_STATUS_SUCCESS);
  CHECK(dw == std::vector<float>{1 + 2 + 4 + 5, 2 + 3 + 5 + 6, 4 + 5 + 7 + 8, 5 + 6 + 8 + 9});
}

TEST_CASE("emulated cuDNN batched convolutions match the definition and their adjoints",
          "[cuda_emulation]") {
  const std::vector<Problem> problems = {
      {2, 3, 6, 5, 4, 3, 2, {.pad = 1, .stride = 1}},
      {2, 4, 7, 7, 6, 3, 3, {.pad = 2, .stride = 2}},
      {1, 6, 8, 5, 3, 2, 3, {.pad = 0, .stride = 3}},
      {3, 2, 5, 6, 2, 3, 3, {.pad = 1, .stride = 2}},
  };
  std::mt19937 rng(7);
  Handle h;
  for (const Problem& pb : problems) {
    INFO("x [" << pb.n << "," << pb.c << "," << pb.h << "," << pb.w << "], w [" << pb.k << ","
               << pb.c << "," << pb.r << "," << pb.s << "], pad " << pb.g.pad << ", stride "
               << pb.g.stride);
    TensorDesc xd(CUDNN_DATA_FLOAT, pb.n, pb.c, pb.h, pb.w);
    TensorDesc yd(CUDNN_DATA_FLOAT, pb.n, pb.k, pb.p(), pb.q());
    FilterDesc wd(CUDNN_DATA_FLOAT, pb.k, pb.c, pb.r, pb.s);
    ConvDesc cd(pb.g);
    const std::vector<float> x = small_integers(size_t(pb.n) * pb.c * pb.h * pb.w, rng);
    const std::vector<float> w = small_integers(size_t(pb.k) * pb.c * pb.r * pb.s, rng);
    const std::vector<float> dy = small_integers(size_t(pb.n) * pb.k * pb.p() * pb.q(), rng);

    std::vector<float> y(dy.size(), kNaN);
    REQUIRE(forward(h, 1.0f, xd, x.data(), wd, w.data(), cd, 0.0f, yd, y.data()) ==
            CUDNN_STATUS_SUCCESS);
    const std::vector<double> expected = reference_forward(pb, x, w);
    REQUIRE(y.size() == expected.size());
    for (size_t i = 0; i < y.size(); ++i) REQUIRE(double{y[i]} == expected[i]);

    std::vector<float> dx(x.size(), kNaN), dw(w.size(), kNaN);
    REQUIRE(backward_data(h, 1.0f, wd, w.data(), yd, dy.data(), cd, 0.0f, xd, dx.data()) ==
            CUDNN_STATUS_SUCCESS);
    REQUIRE(backward_filter(h, 1.0f, xd, x.data(), yd, dy.data(), cd, 0.0f, wd, dw.data()) ==
            CUDNN_STATUS_SUCCESS);
    const double forward_dot = dot(y, dy);
    CHECK(dot(x, dx) == forward_dot);
    CHECK(dot(w, dw) == forward_dot);
    // The adjoint identities hold for any dy; check them against a second, one-hot dy too, so
    // that a dx or dw shifted by one element cannot pass on a lucky sum.
    std::vector<float> one_hot(dy.size(), 0.0f);
    one_hot[dy.size() / 2] = 1.0f;
    REQUIRE(backward_data(h, 1.0f, wd, w.data(), yd, one_hot.data(), cd, 0.0f, xd, dx.data()) ==
            CUDNN_STATUS_SUCCESS);
    REQUIRE(backward_filter(h, 1.0f, xd, x.data(), yd, one_hot.data(), cd, 0.0f, wd, dw.data()) ==
            CUDNN_STATUS_SUCCESS);
    CHECK(dot(x, dx) == y[dy.size() / 2]);
    CHECK(dot(w, dw) == y[dy.size() / 2]);
  }
}

TEST_CASE("emulated cuDNN blends alpha and beta and never reads the output when beta is 0",
          "[cuda_emulation]") {
  Handle h;
  TensorDesc xd(CUDNN_DATA_FLOAT, 1, 1, 3, 3), yd(CUDNN_DATA_FLOAT, 1, 1, 2, 2);
  FilterDesc wd(CUDNN_DATA_FLOAT, 1, 1, 2, 2);
  ConvDesc cd({});
  const std::vector<float> dy = {1, 1, 1, 1};

  // Forward: y = alpha * [37 47 67 77] + beta * y.
  std::vector<float> y(4, kNaN);
  REQUIRE(forward(h, 2.0f, xd, kImage.data(), wd, kFilter.data(), cd, 0.0f, yd, y.data()) ==
          CUDNN_STATUS_SUCCESS);
  CHECK(y == std::vector<float>{74, 94, 134, 154});
  y = {1, 2, 3, 4};
  REQUIRE(forward(h, 1.0f, xd, kImage.data(), wd, kFilter.data(), cd, 0.5f, yd, y.data()) ==
          CUDNN_STATUS_SUCCESS);
  CHECK(y == std::vector<float>{37.5f, 48, 68.5f, 79});

  // Backward data: dx = alpha * [1 3 2; 4 10 6; 3 7 4] + beta * dx.
  std::vector<float> dx(9, kNaN);
  REQUIRE(backward_data(h, -1.0f, wd, kFilter.data(), yd, dy.data(), cd, 0.0f, xd, dx.data()) ==
          CUDNN_STATUS_SUCCESS);
  CHECK(dx == std::vector<float>{-1, -3, -2, -4, -10, -6, -3, -7, -4});
  dx.assign(9, 10.0f);
  REQUIRE(backward_data(h, 1.0f, wd, kFilter.data(), yd, dy.data(), cd, 2.0f, xd, dx.data()) ==
          CUDNN_STATUS_SUCCESS);
  CHECK(dx == std::vector<float>{21, 23, 22, 24, 30, 26, 23, 27, 24});

  // Backward filter: dw = alpha * [12 16 24 28] + beta * dw.
  std::vector<float> dw(4, kNaN);
  REQUIRE(backward_filter(h, 0.5f, xd, kImage.data(), yd, dy.data(), cd, 0.0f, wd, dw.data()) ==
          CUDNN_STATUS_SUCCESS);
  CHECK(dw == std::vector<float>{6, 8, 12, 14});
  dw = {1, 1, 1, 1};
  REQUIRE(backward_filter(h, 1.0f, xd, kImage.data(), yd, dy.data(), cd, -1.0f, wd, dw.data()) ==
          CUDNN_STATUS_SUCCESS);
  CHECK(dw == std::vector<float>{11, 15, 23, 27});
}

TEST_CASE("emulated cuDNN accumulates 16-bit data in FP32 and rounds once on store",
          "[cuda_emulation]") {
  // A 1x1 filter of ones over three channels (2^11 or 2^8, 1, 1): the FP32 sum 2^11 + 2 (FP16)
  // or 2^8 + 2 (BF16) is representable, while summing in the 16-bit type would lose each 1 to
  // ties-to-even (2^11 + 1 and 2^8 + 1 lie halfway between neighbours).
  Handle h;
  ConvDesc cd({}, CUDNN_TENSOR_OP_MATH);
  FilterDesc wh(CUDNN_DATA_HALF, 1, 3, 1, 1);
  TensorDesc xh(CUDNN_DATA_HALF, 1, 3, 1, 1), yh(CUDNN_DATA_HALF, 1, 1, 1, 1);
  const std::vector<mixprec::half> x16 = {mixprec::half(2048.0f), mixprec::half(1.0f),
                                          mixprec::half(1.0f)};
  const std::vector<mixprec::half> w16(3, mixprec::half(1.0f));
  mixprec::half y16(kNaN);
  REQUIRE(forward(h, 1.0f, xh, x16.data(), wh, w16.data(), cd, 0.0f, yh, &y16) ==
          CUDNN_STATUS_SUCCESS);
  CHECK(float(y16) == 2050.0f);
  // The blend: 0.5 * 2050 + 0.5 * 6 = 1028.
  y16 = mixprec::half(6.0f);
  REQUIRE(forward(h, 0.5f, xh, x16.data(), wh, w16.data(), cd, 0.5f, yh, &y16) ==
          CUDNN_STATUS_SUCCESS);
  CHECK(float(y16) == 1028.0f);

  FilterDesc wb(CUDNN_DATA_BFLOAT16, 1, 3, 1, 1);
  TensorDesc xb(CUDNN_DATA_BFLOAT16, 1, 3, 1, 1), yb(CUDNN_DATA_BFLOAT16, 1, 1, 1, 1);
  const std::vector<mixprec::bfloat16> xbf = {mixprec::bfloat16(256.0f), mixprec::bfloat16(1.0f),
                                              mixprec::bfloat16(1.0f)};
  const std::vector<mixprec::bfloat16> wbf(3, mixprec::bfloat16(1.0f));
  mixprec::bfloat16 ybf(kNaN);
  REQUIRE(forward(h, 1.0f, xb, xbf.data(), wb, wbf.data(), cd, 0.0f, yb, &ybf) ==
          CUDNN_STATUS_SUCCESS);
  CHECK(float(ybf) == 258.0f);
  // The store rounds to nearest even: 2 * 258 + 2 = 518 lies halfway between the BF16
  // neighbours 516 = 129 * 4 and 520 = 130 * 4 (spacing 4 above 512); the even one is 520.
  ybf = mixprec::bfloat16(2.0f);
  REQUIRE(forward(h, 2.0f, xb, xbf.data(), wb, wbf.data(), cd, 1.0f, yb, &ybf) ==
          CUDNN_STATUS_SUCCESS);
  CHECK(float(ybf) == 520.0f);
}

TEST_CASE("emulated cuDNN rounds FP32 operands to TF32 only when the math type allows it",
          "[cuda_emulation]") {
  // (1 + 2^-12) * 1 + 1 * (-1): 2^-12 exactly under FMA math; TF32 keeps 10 fraction bits, so
  // 1 + 2^-12 rounds to 1 and the sum is 0.
  const float tiny = std::ldexp(1.0f, -12);
  const std::vector<float> x = {1.0f + tiny, 1.0f};
  const std::vector<float> w = {1.0f, -1.0f};
  Handle h;
  TensorDesc xd(CUDNN_DATA_FLOAT, 1, 2, 1, 1), yd(CUDNN_DATA_FLOAT, 1, 1, 1, 1);
  FilterDesc wd(CUDNN_DATA_FLOAT, 1, 2, 1, 1);
  for (const auto& [math, expected] : {std::pair{CUDNN_FMA_MATH, tiny},
                                       std::pair{CUDNN_DEFAULT_MATH, 0.0f},
                                       std::pair{CUDNN_TENSOR_OP_MATH, 0.0f}}) {
    INFO("math type " << static_cast<int>(math));
    ConvDesc cd({}, math);
    float y = kNaN;
    REQUIRE(forward(h, 1.0f, xd, x.data(), wd, w.data(), cd, 0.0f, yd, &y) ==
            CUDNN_STATUS_SUCCESS);
    CHECK(y == expected);
    // Backward data: dx[c] = dy * w[c] with dy = 1 + 2^-12.
    const float dy = 1.0f + tiny;
    std::vector<float> dx(2, kNaN);
    REQUIRE(backward_data(h, 1.0f, wd, w.data(), yd, &dy, cd, 0.0f, xd, dx.data()) ==
            CUDNN_STATUS_SUCCESS);
    const float rounded_dy = expected == 0.0f ? 1.0f : dy;
    CHECK(dx == std::vector<float>{rounded_dy, -rounded_dy});
  }
}

TEST_CASE("emulated cuDNN heuristics rank the preferred algorithm first, then others with "
          "their determinism and workspace", "[cuda_emulation]") {
  Handle h;
  TensorDesc xd(CUDNN_DATA_HALF, 2, 3, 5, 5), yd(CUDNN_DATA_HALF, 2, 4, 5, 5);
  FilterDesc wd(CUDNN_DATA_HALF, 4, 3, 3, 3);
  ConvDesc cd({.pad = 1}, CUDNN_TENSOR_OP_MATH);
  int count = -1;
  cudnnConvolutionFwdAlgoPerf_t fwd[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  REQUIRE(cudnnGetConvolutionForwardAlgorithm_v7(h.get(), xd.get(), wd.get(), cd.get(), yd.get(),
                                                 CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count,
                                                 fwd) == CUDNN_STATUS_SUCCESS);
  REQUIRE(count == 3);
  CHECK(fwd[0].algo == kFwd);
  CHECK(fwd[1].algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM);
  CHECK(fwd[2].algo == CUDNN_CONVOLUTION_FWD_ALGO_GEMM);
  for (int i = 0; i < count; ++i) {
    CHECK(fwd[i].status == CUDNN_STATUS_SUCCESS);
    CHECK(fwd[i].determinism == CUDNN_DETERMINISTIC);
    CHECK(fwd[i].mathType == CUDNN_TENSOR_OP_MATH);
  }
  CHECK(fwd[0].memory == 0);
  CHECK(fwd[2].memory == 4096);
  // The requested count caps the list.
  REQUIRE(cudnnGetConvolutionForwardAlgorithm_v7(h.get(), xd.get(), wd.get(), cd.get(), yd.get(),
                                                 1, &count, fwd) == CUDNN_STATUS_SUCCESS);
  CHECK(count == 1);
  CHECK(fwd[0].algo == kFwd);

  cudnnConvolutionBwdDataAlgoPerf_t data[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
  REQUIRE(cudnnGetConvolutionBackwardDataAlgorithm_v7(h.get(), wd.get(), yd.get(), cd.get(),
                                                      xd.get(), CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                                                      &count, data) == CUDNN_STATUS_SUCCESS);
  REQUIRE(count == 3);
  CHECK(data[0].algo == kBwdData);
  CHECK(data[0].determinism == CUDNN_DETERMINISTIC);
  CHECK(data[1].algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0);
  CHECK(data[1].determinism == CUDNN_NON_DETERMINISTIC);
  CHECK(data[2].algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT);
  CHECK(data[2].determinism == CUDNN_DETERMINISTIC);
  CHECK(data[2].memory == 2048);

  cudnnConvolutionBwdFilterAlgoPerf_t filter[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
  REQUIRE(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h.get(), xd.get(), yd.get(), cd.get(),
                                                        wd.get(), 3, &count, filter) ==
          CUDNN_STATUS_SUCCESS);
  REQUIRE(count == 3);
  CHECK(filter[0].algo == kBwdFilter);
  CHECK(filter[0].determinism == CUDNN_DETERMINISTIC);
  CHECK(filter[1].algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0);
  CHECK(filter[1].determinism == CUDNN_NON_DETERMINISTIC);
  CHECK(filter[2].algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3);
  CHECK(filter[2].determinism == CUDNN_NON_DETERMINISTIC);
  REQUIRE(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
              h.get(), xd.get(), yd.get(), cd.get(), wd.get(),
              CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, filter) == CUDNN_STATUS_SUCCESS);
  REQUIRE(count == 4);
  CHECK(filter[3].algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT);
  CHECK(filter[3].determinism == CUDNN_DETERMINISTIC);

  size_t bytes = 1;
  CHECK(cudnnGetConvolutionForwardWorkspaceSize(h.get(), xd.get(), wd.get(), cd.get(), yd.get(),
                                                kFwd, &bytes) == CUDNN_STATUS_SUCCESS);
  CHECK(bytes == 0);
  CHECK(cudnnGetConvolutionForwardWorkspaceSize(h.get(), xd.get(), wd.get(), cd.get(), yd.get(),
                                                CUDNN_CONVOLUTION_FWD_ALGO_GEMM, &bytes) ==
        CUDNN_STATUS_SUCCESS);
  CHECK(bytes == 4096);
  bytes = 1;
  CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(h.get(), wd.get(), yd.get(), cd.get(),
                                                     xd.get(), kBwdData, &bytes) ==
        CUDNN_STATUS_SUCCESS);
  CHECK(bytes == 0);
  CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(h.get(), xd.get(), yd.get(), cd.get(),
                                                       wd.get(), CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT,
                                                       &bytes) == CUDNN_STATUS_SUCCESS);
  CHECK(bytes == 2048);
  // An algorithm not offered is not emulated, and a value no enumerant has is not supported.
  CHECK(cudnnGetConvolutionForwardWorkspaceSize(h.get(), xd.get(), wd.get(), cd.get(), yd.get(),
                                                CUDNN_CONVOLUTION_FWD_ALGO_FFT, &bytes) ==
        CUDNN_STATUS_NOT_SUPPORTED);
  CHECK(cudnnGetConvolutionForwardWorkspaceSize(
            h.get(), xd.get(), wd.get(), cd.get(), yd.get(),
            static_cast<cudnnConvolutionFwdAlgo_t>(CUDNN_CONVOLUTION_FWD_ALGO_COUNT), &bytes) ==
        CUDNN_STATUS_NOT_SUPPORTED);

  const float one = 1.0f, zero = 0.0f;
  std::vector<mixprec::half> x(2 * 3 * 25), w(4 * 3 * 9), y(2 * 4 * 25), y_gemm(2 * 4 * 25);
  for (size_t i = 0; i < x.size(); ++i) x[i] = mixprec::half(0.25f * static_cast<float>(i % 7) - 0.5f);
  for (size_t i = 0; i < w.size(); ++i) w[i] = mixprec::half(0.125f * static_cast<float>(i % 5) - 0.25f);
  CHECK(cudnnConvolutionForward(h.get(), &one, xd.get(), x.data(), wd.get(), w.data(), cd.get(),
                                CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD, nullptr, 0, &zero, yd.get(),
                                y.data()) == CUDNN_STATUS_NOT_SUPPORTED);
  CHECK(cudnnConvolutionBackwardFilter(h.get(), &one, xd.get(), x.data(), yd.get(), y.data(),
                                       cd.get(), CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED,
                                       nullptr, 0, &zero, wd.get(), w.data()) ==
        CUDNN_STATUS_NOT_SUPPORTED);
  // An algorithm with workspace refuses to run with less than it asked for, and with it
  // computes what the preferred one computes.
  std::vector<unsigned char> workspace(4096);
  CHECK(cudnnConvolutionForward(h.get(), &one, xd.get(), x.data(), wd.get(), w.data(), cd.get(),
                                CUDNN_CONVOLUTION_FWD_ALGO_GEMM, workspace.data(), 4095, &zero,
                                yd.get(), y_gemm.data()) == CUDNN_STATUS_BAD_PARAM);
  CHECK(cudnnConvolutionForward(h.get(), &one, xd.get(), x.data(), wd.get(), w.data(), cd.get(),
                                CUDNN_CONVOLUTION_FWD_ALGO_GEMM, nullptr, 4096, &zero, yd.get(),
                                y_gemm.data()) == CUDNN_STATUS_BAD_PARAM);
  REQUIRE(cudnnConvolutionForward(h.get(), &one, xd.get(), x.data(), wd.get(), w.data(), cd.get(),
                                  kFwd, nullptr, 0, &zero, yd.get(), y.data()) ==
          CUDNN_STATUS_SUCCESS);
  REQUIRE(cudnnConvolutionForward(h.get(), &one, xd.get(), x.data(), wd.get(), w.data(), cd.get(),
                                  CUDNN_CONVOLUTION_FWD_ALGO_GEMM, workspace.data(), 4096, &zero,
                                  yd.get(), y_gemm.data()) == CUDNN_STATUS_SUCCESS);
  bool any_nonzero = false;
  for (size_t i = 0; i < y.size(); ++i) {
    any_nonzero = any_nonzero || static_cast<float>(y[i]) != 0.0f;
    CHECK(y_gemm[i].bits == y[i].bits);
  }
  CHECK(any_nonzero);
}

TEST_CASE("emulated cuDNN refuses inconsistent descriptors with the documented status",
          "[cuda_emulation]") {
  Handle h;
  ConvDesc cd({});  // no padding, stride 1: a 3x3 image and a 2x2 filter give 2x2
  TensorDesc x(CUDNN_DATA_FLOAT, 1, 1, 3, 3), y(CUDNN_DATA_FLOAT, 1, 1, 2, 2);
  FilterDesc w(CUDNN_DATA_FLOAT, 1, 1, 2, 2);
  std::vector<float> xv(2 * 3 * 3, 0.0f), wv(2 * 2 * 2 * 2, 0.0f), yv(2 * 3 * 3, kNaN);

  SECTION("output extents other than the formula's") {
    TensorDesc y3(CUDNN_DATA_FLOAT, 1, 1, 3, 3);
    // CUDNN_STATUS_BAD_PARAM in every pass and query; the output is untouched.
    CHECK(forward(h, 1.0f, x, xv.data(), w, wv.data(), cd, 0.0f, y3, yv.data()) ==
          CUDNN_STATUS_BAD_PARAM);
    CHECK(std::isnan(yv[0]));
    CHECK(last_error().find("yDesc is [1, 1, 3, 3]") != std::string::npos);
    CHECK(last_error().find("gives [1, 1, 2, 2]") != std::string::npos);
    int count = -1;
    cudnnConvolutionFwdAlgoPerf_t perf;
    CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h.get(), x.get(), w.get(), cd.get(), y3.get(), 1,
                                                 &count, &perf) == CUDNN_STATUS_BAD_PARAM);
    CHECK(count == 0);
    size_t bytes = 0;
    CHECK(cudnnGetConvolutionForwardWorkspaceSize(h.get(), x.get(), w.get(), cd.get(), y3.get(),
                                                  kFwd, &bytes) == CUDNN_STATUS_BAD_PARAM);
    CHECK(backward_data(h, 1.0f, w, wv.data(), y3, yv.data(), cd, 0.0f, x, xv.data()) ==
          CUDNN_STATUS_BAD_PARAM);
    CHECK(backward_filter(h, 1.0f, x, xv.data(), y3, yv.data(), cd, 0.0f, w, wv.data()) ==
          CUDNN_STATUS_BAD_PARAM);
    // An output channel count other than the filter's.
    TensorDesc y2c(CUDNN_DATA_FLOAT, 1, 2, 2, 2);
    CHECK(forward(h, 1.0f, x, xv.data(), w, wv.data(), cd, 0.0f, y2c, yv.data()) ==
          CUDNN_STATUS_BAD_PARAM);
    // A filter larger than the padded input.
    FilterDesc w4(CUDNN_DATA_FLOAT, 1, 1, 4, 4);
    CHECK(forward(h, 1.0f, x, xv.data(), w4, wv.data(), cd, 0.0f, y, yv.data()) ==
          CUDNN_STATUS_BAD_PARAM);
    CHECK(last_error().find("is larger than xDesc") != std::string::npos);
    int n, c, hh, ww;
    CHECK(cudnnGetConvolution2dForwardOutputDim(cd.get(), x.get(), w4.get(), &n, &c, &hh, &ww) ==
          CUDNN_STATUS_BAD_PARAM);
  }

  SECTION("input channels other than the filter's") {
    TensorDesc x2(CUDNN_DATA_FLOAT, 1, 2, 3, 3);
    CHECK(forward(h, 1.0f, x2, xv.data(), w, wv.data(), cd, 0.0f, y, yv.data()) ==
          CUDNN_STATUS_BAD_PARAM);
    CHECK(last_error().find("2 input channels") != std::string::npos);
    CHECK(backward_data(h, 1.0f, w, wv.data(), y, yv.data(), cd, 0.0f, x2, xv.data()) ==
          CUDNN_STATUS_BAD_PARAM);
    CHECK(backward_filter(h, 1.0f, x2, xv.data(), y, yv.data(), cd, 0.0f, w, wv.data()) ==
          CUDNN_STATUS_BAD_PARAM);
    int count = 0;
    cudnnConvolutionFwdAlgoPerf_t perf;
    CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h.get(), x2.get(), w.get(), cd.get(), y.get(), 1,
                                                 &count, &perf) == CUDNN_STATUS_BAD_PARAM);
    size_t bytes = 0;
    CHECK(cudnnGetConvolutionForwardWorkspaceSize(h.get(), x2.get(), w.get(), cd.get(), y.get(),
                                                  kFwd, &bytes) == CUDNN_STATUS_BAD_PARAM);
  }

  SECTION("data types that differ") {
    // CUDNN_STATUS_NOT_SUPPORTED, which is what cuDNN 9 answers (its reference lists
    // BAD_PARAM); the heuristics answer with algorithms of that status.
    TensorDesc xh(CUDNN_DATA_HALF, 1, 1, 3, 3);
    CHECK(forward(h, 1.0f, xh, xv.data(), w, wv.data(), cd, 0.0f, y, yv.data()) ==
          CUDNN_STATUS_NOT_SUPPORTED);
    CHECK(last_error().find("different data types") != std::string::npos);
    CHECK(std::isnan(yv[0]));
    FilterDesc wb(CUDNN_DATA_BFLOAT16, 1, 1, 2, 2);
    CHECK(backward_data(h, 1.0f, wb, wv.data(), y, yv.data(), cd, 0.0f, x, xv.data()) ==
          CUDNN_STATUS_NOT_SUPPORTED);
    TensorDesc yh(CUDNN_DATA_HALF, 1, 1, 2, 2);
    CHECK(backward_filter(h, 1.0f, x, xv.data(), yh, yv.data(), cd, 0.0f, w, wv.data()) ==
          CUDNN_STATUS_NOT_SUPPORTED);
    int count = 0;
    cudnnConvolutionBwdFilterAlgoPerf_t perf;
    REQUIRE(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h.get(), x.get(), yh.get(), cd.get(),
                                                          w.get(), 1, &count, &perf) ==
            CUDNN_STATUS_SUCCESS);
    REQUIRE(count == 1);
    CHECK(perf.status == CUDNN_STATUS_NOT_SUPPORTED);
    size_t bytes = 0;
    CHECK(cudnnGetConvolutionForwardWorkspaceSize(h.get(), xh.get(), w.get(), cd.get(), y.get(),
                                                  kFwd, &bytes) == CUDNN_STATUS_NOT_SUPPORTED);
    // A shape error as well is CUDNN_STATUS_BAD_PARAM: shapes are checked first.
    TensorDesc x2h(CUDNN_DATA_HALF, 1, 2, 3, 3);
    CHECK(forward(h, 1.0f, x2h, xv.data(), w, wv.data(), cd, 0.0f, y, yv.data()) ==
          CUDNN_STATUS_BAD_PARAM);
  }

  SECTION("descriptor values and missing arguments") {
    cudnnTensorDescriptor_t t = nullptr;
    REQUIRE(cudnnCreateTensorDescriptor(&t) == CUDNN_STATUS_SUCCESS);
    CHECK(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 0, 3, 3) ==
          CUDNN_STATUS_BAD_PARAM);
    CHECK(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, -1, 3, 3) ==
          CUDNN_STATUS_BAD_PARAM);
    CHECK(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, 1, 1, 3, 3) ==
          CUDNN_STATUS_NOT_SUPPORTED);
    CHECK(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, CUDNN_DATA_DOUBLE, 1, 1, 3, 3) ==
          CUDNN_STATUS_NOT_SUPPORTED);
    CHECK(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1 << 16, 1 << 16, 1,
                                     1) == CUDNN_STATUS_NOT_SUPPORTED);
    // A descriptor never set is refused where it is used.
    CHECK(forward(h, 1.0f, x, xv.data(), w, wv.data(), cd, 0.0f, y, yv.data()) ==
          CUDNN_STATUS_SUCCESS);
    float alpha = 1.0f, beta = 0.0f;
    CHECK(cudnnConvolutionForward(h.get(), &alpha, t, xv.data(), w.get(), wv.data(), cd.get(),
                                  kFwd, nullptr, 0, &beta, y.get(), yv.data()) ==
          CUDNN_STATUS_BAD_PARAM);
    cudnnDestroyTensorDescriptor(t);

    cudnnConvolutionDescriptor_t c = nullptr;
    REQUIRE(cudnnCreateConvolutionDescriptor(&c) == CUDNN_STATUS_SUCCESS);
    CHECK(cudnnSetConvolution2dDescriptor(c, -1, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                          CUDNN_DATA_FLOAT) == CUDNN_STATUS_BAD_PARAM);
    CHECK(cudnnSetConvolution2dDescriptor(c, 0, 0, 0, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                          CUDNN_DATA_FLOAT) == CUDNN_STATUS_BAD_PARAM);
    CHECK(cudnnSetConvolution2dDescriptor(c, 0, 0, 1, 1, 1, 0, CUDNN_CROSS_CORRELATION,
                                          CUDNN_DATA_FLOAT) == CUDNN_STATUS_BAD_PARAM);
    CHECK(cudnnSetConvolution2dDescriptor(c, 0, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                          CUDNN_DATA_HALF) == CUDNN_STATUS_NOT_SUPPORTED);
    CHECK(cudnnSetConvolutionMathType(c, CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) ==
          CUDNN_STATUS_NOT_SUPPORTED);
    // What the backend never asks for is refused rather than emulated.
    CHECK(cudnnSetConvolution2dDescriptor(c, 0, 0, 1, 1, 1, 1, CUDNN_CONVOLUTION,
                                          CUDNN_DATA_FLOAT) == CUDNN_STATUS_NOT_SUPPORTED);
    CHECK(last_error().find("CUDNN_CONVOLUTION is not emulated") != std::string::npos);
    CHECK(cudnnSetConvolution2dDescriptor(c, 0, 0, 1, 1, 2, 1, CUDNN_CROSS_CORRELATION,
                                          CUDNN_DATA_FLOAT) == CUDNN_STATUS_NOT_SUPPORTED);
    CHECK(last_error().find("dilation 2x1 is not emulated") != std::string::npos);
    cudnnDestroyConvolutionDescriptor(c);

    CHECK(forward(h, 1.0f, x, nullptr, w, wv.data(), cd, 0.0f, y, yv.data()) ==
          CUDNN_STATUS_BAD_PARAM);
    CHECK(cudnnConvolutionForward(h.get(), nullptr, x.get(), xv.data(), w.get(), wv.data(),
                                  cd.get(), kFwd, nullptr, 0, &beta, y.get(),
                                  yv.data()) == CUDNN_STATUS_BAD_PARAM);
  }
}

TEST_CASE("emulated cuDNN handle keeps its stream and names its statuses", "[cuda_emulation]") {
  Handle h;
  cudaStream_t stream = nullptr;
  REQUIRE(cudnnGetStream(h.get(), &stream) == CUDNN_STATUS_SUCCESS);
  CHECK(stream == nullptr);
  int token = 0;
  const auto fake = reinterpret_cast<cudaStream_t>(&token);
  REQUIRE(cudnnSetStream(h.get(), fake) == CUDNN_STATUS_SUCCESS);
  REQUIRE(cudnnGetStream(h.get(), &stream) == CUDNN_STATUS_SUCCESS);
  CHECK(stream == fake);
  CHECK(std::string(cudnnGetErrorString(CUDNN_STATUS_SUCCESS)) == "CUDNN_STATUS_SUCCESS");
  CHECK(std::string(cudnnGetErrorString(CUDNN_STATUS_BAD_PARAM)) == "CUDNN_STATUS_BAD_PARAM");
  CHECK(std::string(cudnnGetErrorString(CUDNN_STATUS_NOT_SUPPORTED)) ==
        "CUDNN_STATUS_NOT_SUPPORTED");
  CHECK(cudnnGetVersion() == size_t{CUDNN_MAJOR} * 10000 + CUDNN_MINOR * 100 + CUDNN_PATCHLEVEL);
}
