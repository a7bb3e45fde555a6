// The Winograd F(2x2, 3x3) convolution of the CPU backend (core/cpu/cpu_winograd.h): which
// geometries take it, forward and backward data through the Backend against a direct
// double-precision convolution in F32, F16 and BF16 (whole and partial edge tiles, with and
// without bias, several groups of images; BF16 also on the dot products, within the bound of
// its rounded transforms), and the independence of its bits from the thread count.
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
#include "core/cpu/bf16_dot_gemm.h"
#include "core/cpu/cpu_winograd.h"
#include "core/cpu/tile_gemm.h"
#include "core/error.h"
#include "core/generator.h"
#include "core/tensor.h"
#include "tests/core/cpu_test_util.h"
#include "tests/core/packed_gemm_checks.h"

namespace {

using namespace mixprec;
using mixprec::testing::check_close;
using mixprec::testing::random_of;
using mixprec::testing::unit_roundoff;
using backend_checks::Conv2dGeometry;
using Bf16DotSwitch = testing::PathSwitch<cpu::bf16_dot_available, cpu::set_bf16_dot_allowed>;

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

// The magnitudes that bound the BF16 dot-product path's errors: per output, |A^T| M |A| with
// M = sum over input channels of (|G| |g| |G|^T) * (|B|^T |d| |B|), the transforms' matrices
// taken entry by entry in absolute value, d the 4x4 input patch of the output's tile (zero
// outside the image) and g the 3x3 filter. `in` holds planes [n][cin][h][w] and `filters`
// [cout][cin][3][3]; out is [n][cout][h][w].
std::vector<double> winograd_magnitude(int64_t n, int64_t cin, int64_t cout, int64_t h,
                                       int64_t w, const std::vector<float>& in,
                                       const std::vector<float>& filters) {
  constexpr double bt[4][4] = {{1, 0, 1, 0}, {0, 1, 1, 0}, {0, 1, 1, 0}, {0, 1, 0, 1}};
  constexpr double g_abs[4][3] = {{1, 0, 0}, {.5, .5, .5}, {.5, .5, .5}, {0, 0, 1}};
  constexpr double at[2][4] = {{1, 1, 1, 0}, {0, 1, 1, 1}};
  std::vector<double> out(static_cast<size_t>(n * cout * h * w), 0.0);
  for (int64_t img = 0; img < n; ++img)
    for (int64_t ty = 0; 2 * ty < h; ++ty)
      for (int64_t tx = 0; 2 * tx < w; ++tx)
        for (int64_t o = 0; o < cout; ++o) {
          double m[4][4] = {};
          for (int64_t c = 0; c < cin; ++c) {
            double d[4][4], v[4][4] = {}, u[4][4] = {};
            for (int a = 0; a < 4; ++a)
              for (int b = 0; b < 4; ++b) {
                const int64_t r = 2 * ty - 1 + a, q = 2 * tx - 1 + b;
                const bool inside = r >= 0 && r < h && q >= 0 && q < w;
                d[a][b] = inside ? std::abs(in[((img * cin + c) * h + r) * w + q]) : 0.0;
              }
            for (int i = 0; i < 4; ++i)
              for (int j = 0; j < 4; ++j)
                for (int a = 0; a < 4; ++a)
                  for (int b = 0; b < 4; ++b) v[i][j] += bt[i][a] * d[a][b] * bt[j][b];
            const float* f = filters.data() + (o * cin + c) * 9;
            for (int i = 0; i < 4; ++i)
              for (int j = 0; j < 4; ++j)
                for (int a = 0; a < 3; ++a)
                  for (int b = 0; b < 3; ++b)
                    u[i][j] += g_abs[i][a] * std::abs(f[a * 3 + b]) * g_abs[j][b];
            for (int i = 0; i < 4; ++i)
              for (int j = 0; j < 4; ++j) m[i][j] += u[i][j] * v[i][j];
          }
          for (int r = 0; r < 2 && 2 * ty + r < h; ++r)
            for (int q = 0; q < 2 && 2 * tx + q < w; ++q) {
              double y = 0.0;
              for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 4; ++j) y += at[r][i] * m[i][j] * at[q][j];
              out[static_cast<size_t>(((img * cout + o) * h + 2 * ty + r) * w + 2 * tx + q)] = y;
            }
        }
  return out;
}

// The filters of backward data as a forward convolution: w'[c][o] = rot180(w[o][c]).
std::vector<float> flipped_transposed(const SameConv& g, const std::vector<float>& w) {
  std::vector<float> out(w.size());
  for (int64_t o = 0; o < g.o; ++o)
    for (int64_t c = 0; c < g.c; ++c)
      for (int t = 0; t < 9; ++t) out[(c * g.o + o) * 9 + t] = w[(o * g.c + c) * 9 + 8 - t];
  return out;
}

// The BF16 dot-product path rounds U and V to BF16 (unit roundoff u_b = 2^-8) after computing
// them in FP32 (a few roundings of 2^-24 each, relative to the magnitudes), multiplies them
// exactly and sums over the input channels in FP32: with e = u_b + 8 * 2^-24 for each rounded
// operand, |M' - M| <= (2e + e^2 + gamma(C) (1 + e)^2) * sum |U| |V|, and the output
// transform carries that through |A^T| . |A| plus a few FP32 roundings of its own. The one
// rounding of the stored output is the check's u * |value|.
double dot_path_rel(int64_t channels) {
  const double u32 = std::ldexp(1.0, -24), e = std::ldexp(1.0, -8) + 8 * u32;
  const double gamma = channels * u32 / (1.0 - channels * u32);
  return 2 * e + e * e + gamma * (1 + e) * (1 + e) + 16 * u32;
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

// dot_path: BF16 on the dot-product path, held to the bound of dot_path_rel over the Winograd
// magnitudes; otherwise to kRelSum of the direct sum's magnitudes.
void check_case(const SameConv& g, DType dtype, uint64_t seed, bool dot_path = false) {
  if (cpu::tile_gemm_vectorised()) REQUIRE(cpu::winograd_applies(g.geometry()));
  Backend& backend = backend_for(kCPU);
  const Shape xs{g.n, g.c, g.h, g.w}, ws{g.o, g.c, 3, 3}, ys{g.n, g.o, g.h, g.w};
  const Tensor x = random_of(xs, seed, dtype), w = random_of(ws, seed + 1, dtype);
  const Tensor bias = random_of({g.o}, seed + 2, dtype), dy = random_of(ys, seed + 3, dtype);
  const std::vector<float> vx = x.to_float_vector(), vw = w.to_float_vector();
  const std::vector<float> vb = bias.to_float_vector(), vdy = dy.to_float_vector();
  const double u = unit_roundoff(dtype);
  const std::string where = g.describe() + " " + std::string(dtype_name(dtype)) +
                            (dot_path ? " (dot products)" : "");
  // The reference's magnitudes and the share of them the path may be off by.
  const auto check = [&](const std::vector<float>& got, Reference ref,
                         const std::vector<double>& winograd_mag, const std::string& what) {
    if (dot_path) ref.abs_sum = winograd_mag;
    check_against(got, ref, u, dot_path ? dot_path_rel(g.c > g.o ? g.c : g.o) : kRelSum,
                  what + ", " + where);
  };
  const std::vector<double> forward_mag =
      dot_path ? winograd_magnitude(g.n, g.c, g.o, g.h, g.w, vx, vw) : std::vector<double>();
  const std::vector<double> backward_mag =
      dot_path ? winograd_magnitude(g.n, g.o, g.c, g.h, g.w, vdy, flipped_transposed(g, vw))
               : std::vector<double>();

  Tensor y = Tensor::full(ys, 99.0, dtype);  // overwritten
  backend.conv2d(x, w, nullptr, same_padding(), y);
  check(y.to_float_vector(), direct_forward(g, vx, vw, nullptr), forward_mag, "winograd forward");
  backend.conv2d(x, w, &bias, same_padding(), y);
  std::vector<double> with_bias = forward_mag;
  for (size_t i = 0; i < with_bias.size(); ++i)
    with_bias[i] += std::abs(vb[(i / static_cast<size_t>(g.h * g.w)) % static_cast<size_t>(g.o)]);
  check(y.to_float_vector(), direct_forward(g, vx, vw, &vb), with_bias,
        "winograd forward with bias");

  Tensor dx = Tensor::full(xs, 99.0, dtype);  // overwritten, never accumulated into
  backend.conv2d_backward_data(dy, w, same_padding(), dx);
  check(dx.to_float_vector(), direct_backward_data(g, vdy, vw), backward_mag,
        "winograd backward data");
}

// Forward with bias and backward data of a case in `dtype`, as raw bits (16-bit values
// widened exactly).
std::vector<float> run_both(const SameConv& g, uint64_t seed, DType dtype = DType::F32) {
  Backend& backend = backend_for(kCPU);
  const Tensor x = random_of({g.n, g.c, g.h, g.w}, seed, dtype);
  const Tensor w = random_of({g.o, g.c, 3, 3}, seed + 1, dtype);
  const Tensor bias = random_of({g.o}, seed + 2, dtype);
  const Tensor dy = random_of({g.n, g.o, g.h, g.w}, seed + 3, dtype);
  Tensor y = Tensor::empty({g.n, g.o, g.h, g.w}, dtype);
  Tensor dx = Tensor::empty({g.n, g.c, g.h, g.w}, dtype);
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
  // BF16 on the widened path first (the tight bound), then on the dot products where the CPU
  // has them.
  const bool dot = cpu::bf16_dot_available();
  for (const SameConv& g : cases) {
    {
      const Bf16DotSwitch widened(false);
      for (DType dtype : {DType::F32, DType::F16, DType::BF16}) check_case(g, dtype, seed += 10);
    }
    if (dot) check_case(g, DType::BF16, seed += 10, true);
  }
}

TEST_CASE("bf16 winograd takes the dot products, which round U and V to BF16", "[winograd]") {
  // The CNN's second layer on two images: the dot path's products of rounded transforms part
  // from the widened path's FP32 ones somewhere, so equal outputs would mean it was not taken.
  const SameConv g{2, 32, 64, 14, 14};
  if (!cpu::tile_gemm_vectorised() || !cpu::bf16_dot_available()) {
    WARN("skipped: no AVX-512 tile GEMM or AVX512-BF16 here");
    return;
  }
  const Tensor x = random_of({g.n, g.c, g.h, g.w}, 77, DType::BF16);
  const Tensor w = random_of({g.o, g.c, 3, 3}, 78, DType::BF16);
  const auto forward = [&] {
    Tensor y = Tensor::empty({g.n, g.o, g.h, g.w}, DType::BF16);
    backend_for(kCPU).conv2d(x, w, nullptr, same_padding(), y);
    return y.to_float_vector();
  };
  const std::vector<float> dot = forward();
  std::vector<float> widened;
  {
    const Bf16DotSwitch off(false);
    widened = forward();
  }
  CHECK(dot != widened);
  // The bound above is a worst case. Typically the rounded transforms add about twice the
  // error of the output's own BF16 rounding: the dot path's RMS error against the exact result
  // measured 2.6 times the widened path's (0.023 against 0.0088 for outputs of RMS about 5),
  // held here to 4 times; a 1% error in the transforms would make it about 7.
  const Reference exact =
      direct_forward(g, x.to_float_vector(), w.to_float_vector(), nullptr);
  const auto rms_error = [&](const std::vector<float>& got) {
    double sum = 0.0;
    for (size_t i = 0; i < got.size(); ++i) sum += std::pow(got[i] - exact.value[i], 2);
    return std::sqrt(sum / static_cast<double>(got.size()));
  };
  const double rms_dot = rms_error(dot), rms_widened = rms_error(widened);
  INFO("RMS error: dot products " << rms_dot << ", widened " << rms_widened);
  CHECK(rms_dot <= 4 * rms_widened);
}

TEST_CASE("winograd conv2d gives the same bits on one thread and on two", "[winograd]") {
  // 20 images of 14x14 make several groups, which two threads share.
  const SameConv g{20, 16, 24, 14, 14};
  if (!cpu::tile_gemm_vectorised()) return;  // the kernels need the AVX-512 tile GEMM
  REQUIRE(cpu::winograd_applies(g.geometry()));
  const int threads = omp_get_max_threads();
  // FP16 and BF16 widen their groups in the workers' own buffers; BF16 also takes the dot
  // products where the CPU has them.
  for (const DType dtype : {DType::F16, DType::BF16}) {
    INFO(dtype_name(dtype));
    omp_set_num_threads(1);
    const std::vector<float> one16 = run_both(g, 321, dtype);
    omp_set_num_threads(2);
    const std::vector<float> two16 = run_both(g, 321, dtype);
    REQUIRE(one16.size() == two16.size());
    CHECK(std::memcmp(one16.data(), two16.data(), one16.size() * sizeof(float)) == 0);
  }
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
