// The Winograd F(2x2, 3x3) convolution of the CPU backend (core/cpu/cpu_winograd.h): which
// geometries take it, forward and backward data through the Backend against a direct
// double-precision convolution in F32, F16 and BF16 (whole and partial edge tiles, with and
// without bias, several groups of images), and the independence of its bits from the thread
// count.
#include <catch2/catch.hpp>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "core/backend_checks.h"
#include "core/cpu/cpu_winograd.h"
#include "core/cpu/tile_gemm.h"
#include "core/error.h"
#include "core/generator.h"
#include "core/tensor.h"
#include "tests/core/cpu_test_util.h"

namespace {

using namespace mixprec;
using mixprec::testing::check_close;
using mixprec::testing::random_of;
using mixprec::testing::unit_roundoff;
using backend_checks::Conv2dGeometry;

// A 3x3 stride-1 pad-1 convolution of x [n, c, h, w] by w [o, c, 3, 3].
struct SameConv {
  int64_t n, c, o, h, w;
  std::string describe() const {
    std::ostringstream s;
    s << "x [" << n << "," << c << "," << h << "," << w << "] w [" << o << "," << c << ",3,3]";
    return s.str();
  }
  Conv2dGeometry geometry() const { return {n, c, h, w, o, 3, 3, h, w, 1, 1, 1, 1}; }
};

Conv2dGeometry geometry(int64_t c, int64_t o, int64_t k, int64_t stride, int64_t pad,
                        int64_t h = 14, int64_t w = 14) {
  const int64_t oh = (h + 2 * pad - k) / stride + 1, ow = (w + 2 * pad - k) / stride + 1;
  return {2, c, h, w, o, k, k, oh, ow, stride, stride, pad, pad};
}

// A direct convolution in double: the value of every output and the sum of the magnitudes of
// its terms (bias included), which bounds the FP32 rounding errors.
struct Reference {
  std::vector<double> value, abs_sum;
};

// y[n][o][r][q] = bias[o] + sum over (c, i, j) of x[n][c][r + i - 1][q + j - 1] * w[o][c][i][j].
Reference direct_forward(const SameConv& g, const std::vector<float>& x,
                         const std::vector<float>& w, const std::vector<float>* bias) {
  Reference ref{std::vector<double>(static_cast<size_t>(g.n * g.o * g.h * g.w)), {}};
  ref.abs_sum = ref.value;
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t o = 0; o < g.o; ++o)
      for (int64_t r = 0; r < g.h; ++r)
        for (int64_t q = 0; q < g.w; ++q) {
          double s = bias ? (*bias)[o] : 0.0, a = std::abs(s);
          for (int64_t c = 0; c < g.c; ++c)
            for (int64_t i = 0; i < 3; ++i)
              for (int64_t j = 0; j < 3; ++j) {
                const int64_t ih = r + i - 1, iw = q + j - 1;
                if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) continue;
                const double t = static_cast<double>(x[((n * g.c + c) * g.h + ih) * g.w + iw]) *
                                 w[((o * g.c + c) * 3 + i) * 3 + j];
                s += t;
                a += std::abs(t);
              }
          const size_t at = static_cast<size_t>(((n * g.o + o) * g.h + r) * g.w + q);
          ref.value[at] = s;
          ref.abs_sum[at] = a;
        }
  return ref;
}

// dx[n][c][r][q] = sum over the outputs (o, r', q') that read input cell (r, q) through tap
// (i, j) = (r - r' + 1, q - q' + 1) of dy[n][o][r'][q'] * w[o][c][i][j]: the adjoint written
// from the definition, not as a flipped convolution.
Reference direct_backward_data(const SameConv& g, const std::vector<float>& dy,
                               const std::vector<float>& w) {
  Reference ref{std::vector<double>(static_cast<size_t>(g.n * g.c * g.h * g.w)), {}};
  ref.abs_sum = ref.value;
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t o = 0; o < g.o; ++o)
      for (int64_t r = 0; r < g.h; ++r)
        for (int64_t q = 0; q < g.w; ++q) {
          const double d = dy[((n * g.o + o) * g.h + r) * g.w + q];
          for (int64_t c = 0; c < g.c; ++c)
            for (int64_t i = 0; i < 3; ++i)
              for (int64_t j = 0; j < 3; ++j) {
                const int64_t ih = r + i - 1, iw = q + j - 1;
                if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) continue;
                const double t = d * w[((o * g.c + c) * 3 + i) * 3 + j];
                const size_t at = static_cast<size_t>(((n * g.c + c) * g.h + ih) * g.w + iw);
                ref.value[at] += t;
                ref.abs_sum[at] += std::abs(t);
              }
        }
  return ref;
}

// got within u * |value| + rel_sum * abs_sum of the reference, element by element.
void check_against(const std::vector<float>& got, const Reference& ref, double u,
                   double rel_sum, const std::string& what) {
  check_close(got, ref.value, ref.abs_sum, u, rel_sum, what);
}

Conv2dDesc same_padding() {
  Conv2dDesc desc;
  desc.pad_h = 1;
  desc.pad_w = 1;
  return desc;
}

// FP32 error allowed per unit of sum|terms|. The transforms add up to nine inputs and up to
// nine filter values before the products and nine products after them, so an output carries
// a few more roundings than the direct sum's C * 9; 2e-6 is about 33 units of FP32 roundoff.
constexpr double kRelSum = 2e-6;

void check_case(const SameConv& g, DType dtype, uint64_t seed) {
  if (cpu::tile_gemm_vectorised()) REQUIRE(cpu::winograd_applies(g.geometry()));
  Backend& backend = backend_for(kCPU);
  const Shape xs{g.n, g.c, g.h, g.w}, ws{g.o, g.c, 3, 3}, ys{g.n, g.o, g.h, g.w};
  const Tensor x = random_of(xs, seed, dtype), w = random_of(ws, seed + 1, dtype);
  const Tensor bias = random_of({g.o}, seed + 2, dtype), dy = random_of(ys, seed + 3, dtype);
  const std::vector<float> vx = x.to_float_vector(), vw = w.to_float_vector();
  const std::vector<float> vb = bias.to_float_vector(), vdy = dy.to_float_vector();
  const double u = unit_roundoff(dtype);
  const std::string where = g.describe() + " " + std::string(dtype_name(dtype));

  Tensor y = Tensor::full(ys, 99.0, dtype);  // overwritten
  backend.conv2d(x, w, nullptr, same_padding(), y);
  check_against(y.to_float_vector(), direct_forward(g, vx, vw, nullptr), u, kRelSum,
                "winograd forward, " + where);
  backend.conv2d(x, w, &bias, same_padding(), y);
  check_against(y.to_float_vector(), direct_forward(g, vx, vw, &vb), u, kRelSum,
                "winograd forward with bias, " + where);

  Tensor dx = Tensor::full(xs, 99.0, dtype);  // overwritten, never accumulated into
  backend.conv2d_backward_data(dy, w, same_padding(), dx);
  check_against(dx.to_float_vector(), direct_backward_data(g, vdy, vw), u, kRelSum,
                "winograd backward data, " + where);
}

// Forward with bias and backward data of a case in F32, as raw bits.
std::vector<float> run_both(const SameConv& g, uint64_t seed) {
  Backend& backend = backend_for(kCPU);
  const Tensor x = random_of({g.n, g.c, g.h, g.w}, seed, DType::F32);
  const Tensor w = random_of({g.o, g.c, 3, 3}, seed + 1, DType::F32);
  const Tensor bias = random_of({g.o}, seed + 2, DType::F32);
  const Tensor dy = random_of({g.n, g.o, g.h, g.w}, seed + 3, DType::F32);
  Tensor y = Tensor::empty({g.n, g.o, g.h, g.w}), dx = Tensor::empty({g.n, g.c, g.h, g.w});
  backend.conv2d(x, w, &bias, same_padding(), y);
  backend.conv2d_backward_data(dy, w, same_padding(), dx);
  std::vector<float> out = y.to_float_vector();
  const std::vector<float> vdx = dx.to_float_vector();
  out.insert(out.end(), vdx.begin(), vdx.end());
  return out;
}

}  // namespace

TEST_CASE("winograd applies to 3x3 stride-1 pad-1 convolutions of 8 or more channels",
          "[winograd]") {
  const bool vectorised = cpu::tile_gemm_vectorised();
  // The convolutions of configs/cnn_fashion.yaml: 1 -> 32 on 28x28 keeps the direct path,
  // 32 -> 64 on 14x14 takes Winograd.
  CHECK_FALSE(cpu::winograd_applies(geometry(1, 32, 3, 1, 1, 28, 28)));
  CHECK(cpu::winograd_applies(geometry(32, 64, 3, 1, 1)) == vectorised);
  CHECK(cpu::winograd_applies(geometry(8, 8, 3, 1, 1, 1, 1)) == vectorised);
  CHECK(cpu::winograd_applies(geometry(64, 32, 3, 1, 1, 7, 5)) == vectorised);
  // Too few channels on either side.
  CHECK_FALSE(cpu::winograd_applies(geometry(7, 64, 3, 1, 1)));
  CHECK_FALSE(cpu::winograd_applies(geometry(64, 7, 3, 1, 1)));
  // Other kernels, strides and paddings.
  CHECK_FALSE(cpu::winograd_applies(geometry(32, 64, 3, 2, 1)));
  CHECK_FALSE(cpu::winograd_applies(geometry(32, 64, 3, 1, 0)));
  CHECK_FALSE(cpu::winograd_applies(geometry(32, 64, 3, 1, 2)));
  CHECK_FALSE(cpu::winograd_applies(geometry(32, 64, 5, 1, 2)));
  CHECK_FALSE(cpu::winograd_applies(geometry(32, 64, 1, 1, 0)));
  // A 3x1 kernel with padding (1, 0) is stride 1 and keeps the size, but is not 3x3.
  CHECK_FALSE(cpu::winograd_applies({2, 32, 14, 14, 64, 3, 1, 14, 14, 1, 1, 1, 0}));
  // Without the AVX-512 tile GEMM nothing applies.
  cpu::set_tile_gemm_vectorised(false);
  CHECK_FALSE(cpu::winograd_applies(geometry(32, 64, 3, 1, 1)));
  cpu::set_tile_gemm_vectorised(vectorised);
}

TEST_CASE("winograd kernels refuse a geometry they do not apply to", "[winograd]") {
  const Conv2dGeometry g = geometry(4, 8, 3, 1, 1, 2, 2);  // 4 input channels
  std::vector<float> x(2 * 4 * 4), w(8 * 4 * 9), y(2 * 8 * 4);
  CHECK_THROWS_AS(cpu::winograd_conv2d(x.data(), w.data(), nullptr, y.data(), g), Error);
  CHECK_THROWS_AS(cpu::winograd_conv2d_backward_data(y.data(), w.data(), x.data(), g), Error);
}

TEST_CASE("winograd conv2d matches a direct convolution in every dtype", "[winograd]") {
  const SameConv cases[] = {
      {3, 8, 8, 14, 14},   // whole tiles only, the smallest channel counts
      {3, 32, 40, 14, 14}, // the CNN's second layer, narrowed in batch
      {3, 16, 33, 7, 5},   // partial last tile row and column
      {3, 33, 8, 1, 1},    // one partial tile: the centre tap only
      {3, 9, 17, 2, 3},    // one tile row, a partial tile column
      {3, 24, 12, 9, 9},   // odd square
      {13, 8, 9, 14, 14},  // a group of eight images (one transpose out), then five
      {8, 8, 10, 9, 6},    // a group of eight with a partial tile row
      {9, 8, 8, 33, 31},   // blocks of tile rows, the last one a single row; a lone image
  };
  uint64_t seed = 9000;
  for (const SameConv& g : cases)
    for (DType dtype : {DType::F32, DType::F16, DType::BF16}) check_case(g, dtype, seed += 10);
}

TEST_CASE("winograd conv2d gives the same bits on one thread and on two", "[winograd]") {
  // 20 images of 14x14 make several groups, which two threads share.
  const SameConv g{20, 16, 24, 14, 14};
  if (!cpu::tile_gemm_vectorised()) return;  // the kernels need the AVX-512 tile GEMM
  REQUIRE(cpu::winograd_applies(g.geometry()));
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<float> one = run_both(g, 321);
  omp_set_num_threads(2);
  const std::vector<float> two = run_both(g, 321);
  // Inside a parallel region that cannot nest, each thread runs its own call serially (the
  // kernels' entries are called directly: they touch no state shared between calls).
  const std::vector<float> x = random_of({g.n, g.c, g.h, g.w}, 321, DType::F32).to_float_vector();
  const std::vector<float> w = random_of({g.o, g.c, 3, 3}, 322, DType::F32).to_float_vector();
  const std::vector<float> bias = random_of({g.o}, 323, DType::F32).to_float_vector();
  const std::vector<float> dy = random_of({g.n, g.o, g.h, g.w}, 324, DType::F32).to_float_vector();
  std::vector<float> nested[2];
  const int levels = omp_get_max_active_levels();
  omp_set_max_active_levels(1);
#pragma omp parallel num_threads(2)
  {
    const int t = omp_get_thread_num();
    std::vector<float> y(static_cast<size_t>(g.n * g.o * g.h * g.w));
    std::vector<float> dx(static_cast<size_t>(g.n * g.c * g.h * g.w));
    cpu::winograd_conv2d(x.data(), w.data(), bias.data(), y.data(), g.geometry());
    cpu::winograd_conv2d_backward_data(dy.data(), w.data(), dx.data(), g.geometry());
    y.insert(y.end(), dx.begin(), dx.end());
    if (t < 2) nested[t] = std::move(y);
  }
  omp_set_max_active_levels(levels);
  omp_set_num_threads(threads);
  REQUIRE(one.size() == two.size());
  CHECK(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)) == 0);
  for (const std::vector<float>& v : nested) {
    if (v.empty()) continue;  // the region ran with one thread
    REQUIRE(v.size() == one.size());
    CHECK(std::memcmp(one.data(), v.data(), v.size() * sizeof(float)) == 0);
  }
}
