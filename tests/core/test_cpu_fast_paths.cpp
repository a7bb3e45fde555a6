// The CPU backend's fast paths against direct double-precision references, over shapes that
// take them and shapes that miss them, in F32, F16 and BF16: the tile GEMM and transpose of
// the convolutions, im2col / col2im (the flat-shift path of stride-1 "same" convolutions and
// the row-by-row one), 2x2 max pooling and the disjoint-window max-pool backward, batch norm's
// lane sums (and their independence of the thread count), and the buffer cache.
#include <catch2/catch.hpp>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/cpu/buffer_cache.h"
#include "core/cpu/tile_gemm.h"
#include "core/generator.h"
#include "core/tensor.h"
#include "tests/core/cpu_test_util.h"

namespace {

using namespace mixprec;
using mixprec::testing::check_close;
using mixprec::testing::random_of;
using mixprec::testing::unit_roundoff;

std::vector<float> random_values(int64_t n, uint64_t seed, float low = -1.f, float high = 1.f) {
  Generator gen(seed);
  return Tensor::uniform({n}, gen, low, high).to_float_vector();
}

struct ConvCase {
  int64_t n, c, h, w, o, kh, kw, sh, sw, ph, pw;
  std::string describe() const {
    std::ostringstream s;
    s << "x [" << n << "," << c << "," << h << "," << w << "] w [" << o << "," << c << "," << kh
      << "," << kw << "] stride (" << sh << "," << sw << ") pad (" << ph << "," << pw << ")";
    return s.str();
  }
  int64_t oh() const { return (h + 2 * ph - kh) / sh + 1; }
  int64_t ow() const { return (w + 2 * pw - kw) / sw + 1; }
};

// Calls f(n, o, oh, ow, c, i, j, x index, w index, y index) for every product term of the
// convolution whose input cell lies inside the image.
template <class F>
void for_each_term(const ConvCase& g, const F& f) {
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t o = 0; o < g.o; ++o)
      for (int64_t y = 0; y < g.oh(); ++y)
        for (int64_t x = 0; x < g.ow(); ++x)
          for (int64_t c = 0; c < g.c; ++c)
            for (int64_t i = 0; i < g.kh; ++i)
              for (int64_t j = 0; j < g.kw; ++j) {
                const int64_t ih = y * g.sh - g.ph + i, iw = x * g.sw - g.pw + j;
                if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) continue;
                f(((n * g.c + c) * g.h + ih) * g.w + iw, ((o * g.c + c) * g.kh + i) * g.kw + j,
                  ((n * g.o + o) * g.oh() + y) * g.ow() + x, o);
              }
}

void check_conv_case(const ConvCase& g, DType dtype, uint64_t seed) {
  Backend& backend = backend_for(kCPU);
  const Shape xs{g.n, g.c, g.h, g.w}, ws{g.o, g.c, g.kh, g.kw}, ys{g.n, g.o, g.oh(), g.ow()};
  const Tensor x = random_of(xs, seed, dtype), w = random_of(ws, seed + 1, dtype);
  const Tensor bias = random_of({g.o}, seed + 2, dtype), dy = random_of(ys, seed + 3, dtype);
  const std::vector<float> vx = x.to_float_vector(), vw = w.to_float_vector();
  const std::vector<float> vb = bias.to_float_vector(), vdy = dy.to_float_vector();
  Conv2dDesc desc;
  desc.stride_h = g.sh;
  desc.stride_w = g.sw;
  desc.pad_h = g.ph;
  desc.pad_w = g.pw;
  const double u = unit_roundoff(dtype);
  const std::string where = g.describe() + " " + std::string(dtype_name(dtype));

  // Forward, with and without bias.
  std::vector<double> y(static_cast<size_t>(shape_numel(ys))), y_abs(y.size());
  for_each_term(g, [&](int64_t xi, int64_t wi, int64_t yi, int64_t) {
    y[yi] += static_cast<double>(vx[xi]) * vw[wi];
    y_abs[yi] += std::abs(static_cast<double>(vx[xi]) * vw[wi]);
  });
  Tensor out = Tensor::empty(ys, dtype);
  backend.conv2d(x, w, nullptr, desc, out);
  check_close(out.to_float_vector(), y, y_abs, u, 2e-6, "conv2d forward, " + where);
  for (size_t i = 0; i < y.size(); ++i) {
    const int64_t o = static_cast<int64_t>(i) / (g.oh() * g.ow()) % g.o;
    y[i] += vb[o];
    y_abs[i] += std::abs(vb[o]);
  }
  backend.conv2d(x, w, &bias, desc, out);
  check_close(out.to_float_vector(), y, y_abs, u, 2e-6, "conv2d forward with bias, " + where);

  // Backward data: dx[cell] = sum of w * dy over the terms that read the cell.
  std::vector<double> dx(static_cast<size_t>(shape_numel(xs))), dx_abs(dx.size());
  for_each_term(g, [&](int64_t xi, int64_t wi, int64_t yi, int64_t) {
    dx[xi] += static_cast<double>(vw[wi]) * vdy[yi];
    dx_abs[xi] += std::abs(static_cast<double>(vw[wi]) * vdy[yi]);
  });
  Tensor gx = Tensor::full(xs, 99.0, dtype);  // overwritten, never accumulated into
  backend.conv2d_backward_data(dy, w, desc, gx);
  check_close(gx.to_float_vector(), dx, dx_abs, u, 2e-6, "conv2d backward data, " + where);

  // Backward filter and bias.
  std::vector<double> dw(static_cast<size_t>(shape_numel(ws))), dw_abs(dw.size());
  std::vector<double> db(static_cast<size_t>(g.o)), db_abs(db.size());
  for_each_term(g, [&](int64_t xi, int64_t wi, int64_t yi, int64_t) {
    dw[wi] += static_cast<double>(vx[xi]) * vdy[yi];
    dw_abs[wi] += std::abs(static_cast<double>(vx[xi]) * vdy[yi]);
  });
  for (size_t i = 0; i < vdy.size(); ++i) {
    const int64_t o = static_cast<int64_t>(i) / (g.oh() * g.ow()) % g.o;
    db[o] += vdy[i];
    db_abs[o] += std::abs(vdy[i]);
  }
  Tensor gw = Tensor::full(ws, 99.0, dtype), gb = Tensor::full({g.o}, 99.0, dtype);
  backend.conv2d_backward_filter(x, dy, desc, gw, &gb);
  check_close(gw.to_float_vector(), dw, dw_abs, u, 2e-6, "conv2d backward filter, " + where);
  check_close(gb.to_float_vector(), db, db_abs, u, 2e-6, "conv2d backward bias, " + where);
  Tensor gw_only = Tensor::full(ws, 99.0, dtype);
  backend.conv2d_backward_filter(x, dy, desc, gw_only, nullptr);
  check_close(gw_only.to_float_vector(), dw, dw_abs, u, 2e-6,
              "conv2d backward filter without bias, " + where);
}

// Values with ties, signed zeros and NaNs: the cases where the order of a window's scan shows.
Tensor tricky_tensor(const Shape& shape, uint64_t seed, DType dtype) {
  const int64_t n = shape_numel(shape);
  std::vector<float> v(static_cast<size_t>(n));
  uint64_t state = seed * 2654435761u + 1;
  for (int64_t i = 0; i < n; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const int64_t r = static_cast<int64_t>((state >> 33) % 23);
    if (r == 0) v[i] = std::numeric_limits<float>::quiet_NaN();
    else if (r == 1) v[i] = -0.0f;
    else if (r == 2) v[i] = 0.0f;
    else v[i] = static_cast<float>(r % 5) - 2.0f;
  }
  return Tensor::from_vector(v, shape, dtype);
}

// PyTorch's max pooling of one window, cells offered in row-major order: the first NaN, else
// the first of the largest values.
struct WindowMax {
  float value;
  int32_t index;
};

std::vector<WindowMax> reference_max_pool(const std::vector<float>& x, const Shape& xs,
                                          int64_t k, int64_t s, int64_t p) {
  const int64_t planes = xs[0] * xs[1], h = xs[2], w = xs[3];
  const int64_t oh = (h + 2 * p - k) / s + 1, ow = (w + 2 * p - k) / s + 1;
  std::vector<WindowMax> out;
  for (int64_t pl = 0; pl < planes; ++pl)
    for (int64_t y = 0; y < oh; ++y)
      for (int64_t xo = 0; xo < ow; ++xo) {
        WindowMax best{0.0f, -1};
        for (int64_t i = 0; i < k; ++i)
          for (int64_t j = 0; j < k; ++j) {
            const int64_t r = y * s - p + i, c = xo * s - p + j;
            if (r < 0 || r >= h || c < 0 || c >= w) continue;
            const float v = x[(pl * h + r) * w + c];
            const bool take = best.index < 0 ||
                              (!std::isnan(best.value) && (std::isnan(v) || v > best.value));
            if (take) best = {v, static_cast<int32_t>(r * w + c)};
          }
        out.push_back(best);
      }
  return out;
}

bool same_float(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

struct BatchNormResult {
  std::vector<float> y, mean, invstd, running_mean, running_var, dx, dw, db;
};

BatchNormResult run_batch_norm(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& dy,
                               bool training) {
  Backend& backend = backend_for(kCPU);
  const int64_t c = x.size(1);
  const DType dtype = x.dtype();
  Tensor rm = Tensor::from_vector(random_values(c, 41), {c});
  Tensor rv = Tensor::from_vector(random_values(c, 42, 0.5f, 2.0f), {c});
  Tensor y = Tensor::empty(x.shape(), dtype), mean = Tensor::empty({c}), invstd = Tensor::empty({c});
  backend.batch_norm(x, w, b, rm, rv, training, 0.1f, 1e-5f, false, y, mean, invstd);
  Tensor dx = Tensor::empty(x.shape(), dtype), dw = Tensor::empty({c}, dtype), db = Tensor::empty({c}, dtype);
  backend.batch_norm_backward(x, w, mean, invstd, dy, training, nullptr, dx, dw, db);
  return {y.to_float_vector(),  mean.to_float_vector(), invstd.to_float_vector(),
          rm.to_float_vector(), rv.to_float_vector(),   dx.to_float_vector(),
          dw.to_float_vector(), db.to_float_vector()};
}

// tile_gemm_f32 on shapes with ragged panels and row tiles, a transposed a, k = 0, and each
// way of starting c, against double sums.
void check_tile_gemm_cases() {
  struct Case {
    int64_t m, n, k;
  };
  const Case cases[] = {{1, 1, 1}, {7, 17, 5}, {6, 64, 3},   {13, 129, 0},
                        {5, 80, 9}, {12, 196, 33}, {64, 16, 200}, {2, 65, 1}};
  uint64_t seed = 100;
  for (const Case& c : cases) {
    for (bool transposed : {false, true}) {
      for (int start = 0; start < 3; ++start) {  // 0: zero, 1: accumulate, 2: row_init
        const std::vector<float> a = random_values(c.m * c.k, ++seed);
        const std::vector<float> b = random_values(c.k * c.n, ++seed);
        const std::vector<float> init = random_values(c.m * c.n, ++seed);
        const std::vector<float> bias = random_values(c.m, ++seed);
        std::vector<float> out = init;
        // a holds A row-major (m x k), or A^T row-major (k x m) read through the strides.
        const cpu::StridedMatrix view =
            transposed ? cpu::StridedMatrix{a.data(), 1, c.m} : cpu::StridedMatrix{a.data(), c.k, 1};
        cpu::tile_gemm_f32(c.m, c.n, c.k, view, b.data(), out.data(), start == 1,
                           start == 2 ? bias.data() : nullptr);
        std::vector<double> expected(static_cast<size_t>(c.m * c.n));
        std::vector<double> abs_sum(expected.size());
        for (int64_t i = 0; i < c.m; ++i)
          for (int64_t j = 0; j < c.n; ++j) {
            double s = start == 1 ? init[i * c.n + j] : start == 2 ? bias[i] : 0.0;
            double as = std::abs(s);
            for (int64_t p = 0; p < c.k; ++p) {
              const double av = transposed ? a[p * c.m + i] : a[i * c.k + p];
              s += av * b[p * c.n + j];
              as += std::abs(av * b[p * c.n + j]);
            }
            expected[i * c.n + j] = s;
            abs_sum[i * c.n + j] = as;
          }
        std::ostringstream what;
        what << "tile gemm " << c.m << "x" << c.n << "x" << c.k << (transposed ? " A^T" : "")
             << " start " << start;
        check_close(out, expected, abs_sum, 0.0, 2e-6, what.str());
      }
    }
  }
}

}  // namespace

// ---- tile GEMM and transpose --------------------------------------------------------------------

TEST_CASE("cpu tile gemm matches a double reference on edge shapes", "[cpu_fast]") {
  const bool vectorised = cpu::tile_gemm_vectorised();
  for (bool allowed : {true, false}) {
    cpu::set_tile_gemm_vectorised(allowed && vectorised);
    check_tile_gemm_cases();
  }
  cpu::set_tile_gemm_vectorised(vectorised);
}

TEST_CASE("cpu tile gemm reads offset rows in place", "[cpu_fast]") {
  if (!cpu::tile_gemm_vectorised()) return;  // the operand needs the AVX-512 kernel
  // b's row p is the run of `values` at offsets[p]: rows overlap and come in any order.
  const int64_t m = 7, n = 37, k = 5;
  const std::vector<float> values = random_values(200, 17), a = random_values(m * k, 18);
  const std::vector<float> bias = random_values(m, 19);
  const std::vector<int64_t> offsets = {3, 0, 100, 1, 50};
  std::vector<float> out(static_cast<size_t>(m * n), 7.0f);
  cpu::tile_gemm_rows_f32(m, n, k, {a.data(), k, 1}, {values.data(), offsets.data()}, out.data(),
                          bias.data());
  std::vector<double> expected(out.size()), abs_sum(out.size());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = bias[i], as = std::abs(bias[i]);
      for (int64_t p = 0; p < k; ++p) {
        sum += static_cast<double>(a[i * k + p]) * values[offsets[p] + j];
        as += std::abs(static_cast<double>(a[i * k + p]) * values[offsets[p] + j]);
      }
      expected[i * n + j] = sum;
      abs_sum[i * n + j] = as;
    }
  check_close(out, expected, abs_sum, 0.0, 2e-6, "tile gemm over offset rows");
}

TEST_CASE("cpu tile gemm gives the same bits on one thread and spread over the team",
          "[cpu_fast]") {
  // 64 x 196 x 288 is large enough to spread its tiles over the threads outside a parallel
  // region; inside one it runs on the calling thread.
  const int64_t m = 64, n = 196, k = 288;
  const std::vector<float> a = random_values(m * k, 7), b = random_values(k * n, 8);
  const std::vector<float> bias = random_values(m, 9);
  std::vector<float> spread(static_cast<size_t>(m * n)), serial(spread.size());
  cpu::tile_gemm_f32(m, n, k, {a.data(), k, 1}, b.data(), spread.data(), false, bias.data());
#pragma omp parallel num_threads(2)
  {
#pragma omp single
    cpu::tile_gemm_f32(m, n, k, {a.data(), k, 1}, b.data(), serial.data(), false, bias.data());
  }
  CHECK(std::memcmp(spread.data(), serial.data(), spread.size() * sizeof(float)) == 0);
}

TEST_CASE("cpu gemm takes the tile kernel or row blocks or Eigen alone as the product needs",
          "[cpu_fast]") {
  // Backend gemm on products on both sides of the tile kernel's limits (batch 1, B not
  // transposed, alpha 1, beta 0 or 1, k <= 512, m <= 1024) and of the row-block split of the
  // others, against double sums.
  struct Case {
    bool trans_a, trans_b;
    int64_t m, n, k;
    float alpha, beta;
  };
  const Case cases[] = {
      {false, false, 128, 3136, 128, 1.0f, 0.0f},  // a linear layer's backward data
      {true, false, 128, 300, 128, 1.0f, 1.0f},    // its weight gradient, accumulated
      {false, false, 9, 20, 600, 1.0f, 0.0f},      // k over the limit
      {true, false, 1100, 17, 3, 1.0f, 0.0f},      // m over the limit
      {false, true, 5, 33, 7, 1.0f, 0.0f},         // B transposed
      {false, false, 6, 40, 8, 0.5f, 2.0f},        // alpha and beta
      // Eigen in blocks of 64 rows on the threads: a linear layer's forward (B transposed),
      // and A transposed with k over the tile kernel's limit; both end in a partial block.
      {false, true, 200, 100, 600, 1.0f, 0.0f},
      {true, false, 130, 70, 700, 1.0f, 1.0f},
  };
  Backend& backend = backend_for(kCPU);
  uint64_t seed = 7000;
  for (const Case& c : cases) {
    const Tensor a = random_of(c.trans_a ? Shape{c.k, c.m} : Shape{c.m, c.k}, ++seed, DType::F32);
    const Tensor b = random_of(c.trans_b ? Shape{c.n, c.k} : Shape{c.k, c.n}, ++seed, DType::F32);
    Tensor out = random_of({c.m, c.n}, ++seed, DType::F32);
    const std::vector<float> va = a.to_float_vector(), vb = b.to_float_vector();
    const std::vector<float> v0 = out.to_float_vector();
    GemmDesc d;
    d.trans_a = c.trans_a;
    d.trans_b = c.trans_b;
    d.m = c.m;
    d.n = c.n;
    d.k = c.k;
    d.alpha = c.alpha;
    d.beta = c.beta;
    backend.gemm(d, a, b, out);
    std::vector<double> expected(v0.size()), abs_sum(v0.size());
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        double sum = 0, as = 0;
        for (int64_t p = 0; p < c.k; ++p) {
          const double term = static_cast<double>(c.trans_a ? va[p * c.m + i] : va[i * c.k + p]) *
                              (c.trans_b ? vb[j * c.k + p] : vb[p * c.n + j]);
          sum += term;
          as += std::abs(term);
        }
        expected[i * c.n + j] = c.alpha * sum + c.beta * v0[i * c.n + j];
        abs_sum[i * c.n + j] = c.alpha * as + std::abs(c.beta * v0[i * c.n + j]);
      }
    std::ostringstream what;
    what << "gemm " << c.m << "x" << c.n << "x" << c.k << (c.trans_a ? " A^T" : "")
         << (c.trans_b ? " B^T" : "") << " alpha " << c.alpha << " beta " << c.beta;
    check_close(out.to_float_vector(), expected, abs_sum, 0.0, 2e-6, what.str());
  }
}

TEST_CASE("cpu transpose_f32 is exact on whole and ragged blocks", "[cpu_fast]") {
  const bool vectorised = cpu::tile_gemm_vectorised();
  for (bool allowed : {true, false}) {
    cpu::set_tile_gemm_vectorised(allowed && vectorised);
    for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
             {1, 1}, {8, 8}, {16, 24}, {9, 17}, {64, 196}, {3, 100}, {100, 3}}) {
      const std::vector<float> src =
          random_values(rows * cols, static_cast<uint64_t>(rows * 1000 + cols));
      std::vector<float> dst(src.size(), -7.0f);
      cpu::transpose_f32(src.data(), rows, cols, dst.data());
      int64_t bad = 0;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) bad += dst[c * rows + r] == src[r * cols + c] ? 0 : 1;
      INFO(rows << " x " << cols << (allowed ? "" : " portable"));
      CHECK(bad == 0);
    }
  }
  cpu::set_tile_gemm_vectorised(vectorised);
}

// ---- convolution --------------------------------------------------------------------------------

TEST_CASE("cpu conv2d fast paths match a direct convolution", "[cpu_fast]") {
  const ConvCase cases[] = {
      // Stride 1, output as wide as the input: the flat-shift im2col / col2im.
      {2, 3, 9, 9, 13, 3, 3, 1, 1, 1, 1},   // 81 pixels: a 17-column tile edge; 13 = 6+6+1 rows
      {1, 1, 28, 28, 8, 3, 3, 1, 1, 1, 1},  // one channel, one image; dW via dy^T (O <= K)
      {3, 1, 6, 7, 16, 3, 3, 1, 1, 1, 1},   // dW via col^T (O > K)
      {2, 4, 7, 5, 5, 5, 5, 1, 1, 2, 2},    // 5x5, padding 2
      {2, 3, 8, 6, 4, 3, 1, 1, 1, 1, 0},    // 3x1 kernel: shifts in rows only
      {2, 2, 4, 3, 3, 1, 3, 1, 1, 0, 1},    // 1x3 kernel: shifts in columns only
      {1, 2, 1, 1, 3, 5, 5, 1, 1, 2, 2},    // 1x1 image: border columns wider than a row
      {2, 3, 5, 5, 2, 1, 1, 1, 1, 0, 0},    // 1x1 kernel
      // The row-by-row paths.
      {2, 3, 6, 6, 4, 3, 3, 1, 1, 0, 0},    // no padding: narrower output
      {2, 2, 9, 8, 3, 3, 3, 2, 2, 1, 1},    // stride 2
      {1, 2, 5, 6, 3, 2, 2, 1, 1, 1, 1},    // even kernel: output one wider
      {2, 2, 7, 9, 3, 3, 3, 2, 1, 1, 1},    // stride 2 in rows only
      {2, 1, 9, 8, 16, 3, 3, 2, 2, 1, 1},   // dW via col^T (O > K)
  };
  uint64_t seed = 1000;
  for (const ConvCase& g : cases)
    for (DType dtype : {DType::F32, DType::F16, DType::BF16}) check_conv_case(g, dtype, seed += 10);
}

TEST_CASE("cpu conv2d portable paths match a direct convolution", "[cpu_fast]") {
  // Without the AVX-512 kernel: im2col and col2im around Eigen's GEMM.
  const ConvCase cases[] = {
      {2, 3, 9, 9, 13, 3, 3, 1, 1, 1, 1},
      {3, 1, 6, 7, 16, 3, 3, 1, 1, 1, 1},
      {2, 2, 9, 8, 3, 3, 3, 2, 2, 1, 1},
  };
  const bool vectorised = cpu::tile_gemm_vectorised();
  cpu::set_tile_gemm_vectorised(false);
  uint64_t seed = 4000;
  for (const ConvCase& g : cases)
    for (DType dtype : {DType::F32, DType::BF16}) check_conv_case(g, dtype, seed += 10);
  cpu::set_tile_gemm_vectorised(vectorised);
}

TEST_CASE("cpu conv2d of one large image spreads its product over the threads", "[cpu_fast]") {
  // 32 x 900 x 144 multiply-adds: the tile GEMM runs in parallel outside a parallel region.
  // No padding, so that Winograd (3x3 "same" convolutions) does not take it.
  check_conv_case({1, 16, 32, 32, 32, 3, 3, 1, 1, 0, 0}, DType::F32, 77);
}

// ---- max pooling --------------------------------------------------------------------------------

TEST_CASE("cpu 2x2 max pooling keeps the window scan rules for NaN and ties and signed zeros",
          "[cpu_fast]") {
  Backend& backend = backend_for(kCPU);
  // ow 512: fast; 515: generic. With an even h the blocks run across planes: {2, 5, 40, 60}
  // has blocks of 17 rows in planes of 20, so that they start and end inside planes;
  // {8, 16, 28, 28} is the CNN's first pooling at batch 8, split over the threads.
  const Shape shapes[] = {{2, 3, 6, 8},    {1, 2, 7, 5},     {1, 1, 2, 2},
                          {3, 1, 9, 3},    {1, 1, 4, 1024},  {1, 1, 3, 1030},
                          {2, 5, 40, 60},  {8, 16, 28, 28}};
  uint64_t seed = 500;
  for (const Shape& xs : shapes) {
    for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
      const Tensor x = tricky_tensor(xs, ++seed, dtype);
      const std::vector<WindowMax> expected = reference_max_pool(x.to_float_vector(), xs, 2, 2, 0);
      const Shape ys{xs[0], xs[1], xs[2] / 2, xs[3] / 2};
      Tensor y = Tensor::empty(ys, dtype), y_plain = Tensor::empty(ys, dtype);
      Tensor argmax = Tensor::empty(ys, DType::I32);
      Pool2dDesc desc;  // 2x2, stride 2, no padding
      backend.pool2d(desc, x, y, &argmax);
      backend.pool2d(desc, x, y_plain, nullptr);
      const std::vector<float> got = y.to_float_vector(), got_plain = y_plain.to_float_vector();
      const std::vector<int32_t> at = argmax.to_int_vector();
      int64_t bad = 0;
      for (size_t i = 0; i < expected.size(); ++i) {
        bad += same_float(got[i], expected[i].value) ? 0 : 1;
        bad += same_float(got_plain[i], expected[i].value) ? 0 : 1;
        bad += at[i] == expected[i].index ? 0 : 1;
      }
      INFO(shape_str(xs) << " " << dtype_name(dtype));
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("cpu max-pool backward routes each gradient to its argmax", "[cpu_fast]") {
  Backend& backend = backend_for(kCPU);
  struct Case {
    Shape x;
    int64_t k, s, p;
  };
  const Case cases[] = {
      {{2, 3, 7, 5}, 2, 2, 0},  // disjoint windows, odd sizes leave cells uncovered
      {{1, 2, 8, 7}, 3, 3, 1},  // disjoint, padded
      {{1, 2, 8, 8}, 2, 3, 0},  // gaps between windows
      {{2, 1, 4, 4}, 1, 1, 0},
      {{2, 2, 7, 6}, 3, 2, 1},  // overlapping windows: the generic accumulation
  };
  uint64_t seed = 900;
  for (const Case& c : cases) {
    for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
      // Distinct values, so that the argmax is unambiguous.
      const int64_t n = shape_numel(c.x);
      std::vector<float> xv(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) xv[i] = static_cast<float>((i * 37) % n) - n / 2;
      const Tensor x = Tensor::from_vector(xv, c.x, dtype);
      const std::vector<WindowMax> windows = reference_max_pool(x.to_float_vector(), c.x, c.k, c.s, c.p);
      const Shape ys{c.x[0], c.x[1], (c.x[2] + 2 * c.p - c.k) / c.s + 1,
                     (c.x[3] + 2 * c.p - c.k) / c.s + 1};
      Pool2dDesc desc;
      desc.kernel_h = desc.kernel_w = c.k;
      desc.stride_h = desc.stride_w = c.s;
      desc.pad_h = desc.pad_w = c.p;
      Tensor y = Tensor::empty(ys, dtype), argmax = Tensor::empty(ys, DType::I32);
      backend.pool2d(desc, x, y, &argmax);
      // dy with a -0 among its values: the generic sum 0 + (-0) stores +0.
      std::vector<float> dyv = random_values(shape_numel(ys), ++seed);
      dyv[0] = -0.0f;
      const Tensor dy = Tensor::from_vector(dyv, ys, dtype);
      const std::vector<float> g = dy.to_float_vector();
      std::vector<double> expected(static_cast<size_t>(n), 0.0);
      const int64_t plane = c.x[2] * c.x[3], outputs = ys[2] * ys[3];
      for (size_t i = 0; i < windows.size(); ++i)
        expected[static_cast<int64_t>(i) / outputs * plane + windows[i].index] += g[i];
      Tensor dx = Tensor::full(c.x, 5.0, dtype);
      backend.pool2d_backward(desc, dy, &argmax, dx);
      const std::vector<float> got = dx.to_float_vector();
      int64_t bad = 0;
      for (int64_t i = 0; i < n; ++i) {
        // One rounding of an FP32 sum; a single term is exact.
        const double allowed = (unit_roundoff(dtype) + 1e-6) * std::abs(expected[i]);
        bad += std::abs(got[i] - expected[i]) <= allowed ? 0 : 1;
        if (expected[i] == 0.0) bad += std::signbit(got[i]) ? 1 : 0;
      }
      INFO(shape_str(c.x) << " k" << c.k << " s" << c.s << " p" << c.p << " " << dtype_name(dtype));
      CHECK(bad == 0);
    }
  }
}

// ---- batch norm ---------------------------------------------------------------------------------

TEST_CASE("cpu batch norm matches a double reference across lanes and blocks and samples",
          "[cpu_fast]") {
  // 25 values per plane (not a multiple of the 8 lanes), 1640 (more than a 1024-value block),
  // 37 samples (several sample blocks), a single sample.
  const Shape shapes[] = {{37, 3, 5, 5}, {4, 2, 40, 41}, {1, 5, 3, 3}};
  uint64_t seed = 300;
  for (const Shape& xs : shapes) {
    for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
      for (bool training : {true, false}) {
        const int64_t n = xs[0], c = xs[1], inner = xs[2] * xs[3];
        std::vector<float> xv = random_values(shape_numel(xs), ++seed, -1.f, 3.f);
        const Tensor x = Tensor::from_vector(xv, xs, dtype);
        const Tensor w = random_of({c}, ++seed, dtype), b = random_of({c}, ++seed, dtype);
        const Tensor dy = random_of(xs, ++seed, dtype);
        const BatchNormResult got = run_batch_norm(x, w, b, dy, training);
        const std::vector<float> vx = x.to_float_vector(), vw = w.to_float_vector();
        const std::vector<float> vb = b.to_float_vector(), vdy = dy.to_float_vector();
        const std::vector<float> rm0 = random_values(c, 41), rv0 = random_values(c, 42, 0.5f, 2.0f);
        const double count = static_cast<double>(n * inner);
        std::vector<double> y(vx.size()), dx(vx.size()), ones(vx.size(), 1.0);
        std::vector<double> dw(static_cast<size_t>(c)), db(dw.size()), ones_c(dw.size(), 1.0);
        std::vector<double> mean(dw.size()), invstd(dw.size()), rm(dw.size()), rv(dw.size());
        for (int64_t ch = 0; ch < c; ++ch) {
          const auto at = [&](int64_t s, int64_t i) { return (s * c + ch) * inner + i; };
          double m = 0, var = 0;
          for (int64_t s = 0; s < n; ++s)
            for (int64_t i = 0; i < inner; ++i) m += vx[at(s, i)];
          m /= count;
          for (int64_t s = 0; s < n; ++s)
            for (int64_t i = 0; i < inner; ++i) var += (vx[at(s, i)] - m) * (vx[at(s, i)] - m);
          var /= count;
          if (training) {
            mean[ch] = m;
            invstd[ch] = 1.0 / std::sqrt(var + 1e-5);
            rm[ch] = 0.9 * rm0[ch] + 0.1 * m;
            rv[ch] = 0.9 * rv0[ch] + 0.1 * var * count / (count - 1);
          } else {
            mean[ch] = rm0[ch];
            invstd[ch] = 1.0 / std::sqrt(rv0[ch] + 1e-5);
            rm[ch] = rm0[ch];
            rv[ch] = rv0[ch];
          }
          double sum_dy = 0, sum_dy_xhat = 0;
          for (int64_t s = 0; s < n; ++s)
            for (int64_t i = 0; i < inner; ++i) {
              const double xhat = (vx[at(s, i)] - mean[ch]) * invstd[ch];
              y[at(s, i)] = xhat * vw[ch] + vb[ch];
              sum_dy += vdy[at(s, i)];
              sum_dy_xhat += vdy[at(s, i)] * xhat;
            }
          dw[ch] = sum_dy_xhat;
          db[ch] = sum_dy;
          for (int64_t s = 0; s < n; ++s)
            for (int64_t i = 0; i < inner; ++i) {
              const double xhat = (vx[at(s, i)] - mean[ch]) * invstd[ch];
              const double centred =
                  training ? vdy[at(s, i)] - sum_dy / count - xhat * sum_dy_xhat / count
                           : vdy[at(s, i)];
              dx[at(s, i)] = vw[ch] * invstd[ch] * centred;
            }
        }
        const double u = unit_roundoff(dtype);
        std::ostringstream where;
        where << shape_str(xs) << " " << dtype_name(dtype) << (training ? " training" : " eval");
        // Values are O(1); their FP32 math is good to a few ulps of O(10).
        check_close(got.y, y, ones, u, 1e-5, "batch norm y, " + where.str());
        check_close(got.mean, mean, ones_c, 0, 1e-6, "batch norm mean, " + where.str());
        check_close(got.invstd, invstd, ones_c, 0, 1e-5, "batch norm invstd, " + where.str());
        check_close(got.running_mean, rm, ones_c, 0, 1e-6, "running mean, " + where.str());
        check_close(got.running_var, rv, ones_c, 0, 1e-5, "running var, " + where.str());
        check_close(got.dx, dx, ones, u, 1e-5, "batch norm dx, " + where.str());
        // Sums over up to 13120 terms of O(1): one rounding plus FP32 error of the sum.
        std::vector<double> sum_scale(dw.size(), count);
        check_close(got.dw, dw, sum_scale, u, 1e-6, "batch norm dweight, " + where.str());
        check_close(got.db, db, sum_scale, u, 1e-6, "batch norm dbias, " + where.str());
      }
    }
  }
}

TEST_CASE("cpu batch norm gives the same bits on one thread and on several", "[cpu_fast]") {
  const Shape xs{40, 4, 16, 16};  // large enough to run in parallel
  for (DType dtype : {DType::F32, DType::BF16}) {
    const Tensor x = random_of(xs, 61, dtype), dy = random_of(xs, 62, dtype);
    const Tensor w = random_of({4}, 63, dtype), b = random_of({4}, 64, dtype);
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    const BatchNormResult one = run_batch_norm(x, w, b, dy, true);
    omp_set_num_threads(3);
    const BatchNormResult several = run_batch_norm(x, w, b, dy, true);
    omp_set_num_threads(threads);
    INFO(dtype_name(dtype));
    const auto same = [](const std::vector<float>& a, const std::vector<float>& b2) {
      return a.size() == b2.size() && std::memcmp(a.data(), b2.data(), a.size() * sizeof(float)) == 0;
    };
    CHECK(same(one.y, several.y));
    CHECK(same(one.mean, several.mean));
    CHECK(same(one.invstd, several.invstd));
    CHECK(same(one.running_var, several.running_var));
    CHECK(same(one.dx, several.dx));
    CHECK(same(one.dw, several.dw));
    CHECK(same(one.db, several.db));
  }
}

TEST_CASE("cpu batch norm backward of an empty batch gives zero parameter gradients",
          "[cpu_fast]") {
  Backend& backend = backend_for(kCPU);
  const Shape xs{0, 3, 4, 4};
  const Tensor x = Tensor::empty(xs), dy = Tensor::empty(xs), w = Tensor::ones({3});
  const Tensor mean = Tensor::zeros({3}), invstd = Tensor::ones({3});
  Tensor dx = Tensor::empty(xs), dw = Tensor::full({3}, 9.0), db = Tensor::full({3}, 9.0);
  backend.batch_norm_backward(x, w, mean, invstd, dy, true, nullptr, dx, dw, db);
  CHECK(dw.to_float_vector() == std::vector<float>{0.0f, 0.0f, 0.0f});
  CHECK(db.to_float_vector() == std::vector<float>{0.0f, 0.0f, 0.0f});
}

// ---- buffer cache -------------------------------------------------------------------------------

TEST_CASE("cpu buffer cache reuses large buffers and skips small ones and drops idle ones",
          "[cpu_fast]") {
  Backend& backend = backend_for(kCPU);
  cpu::release_cached_buffers();
  REQUIRE(cpu::cached_buffer_bytes() == 0);

  // A large buffer comes back for a request of the same page-rounded size.
  const size_t large = cpu::kMinCachedBytes + 100;
  const size_t size_class = (large + 4095) / 4096 * 4096;
  void* p = backend.allocate(large);
  std::memset(p, 1, large);
  backend.deallocate(p, large);
  CHECK(cpu::cached_buffer_bytes() == size_class);
  void* q = backend.allocate(size_class - 10);  // same class
  CHECK(q == p);
  CHECK(cpu::cached_buffer_bytes() == 0);
  std::memset(q, 2, size_class - 10);  // the whole request is usable
  backend.deallocate(q, size_class - 10);

  // Small buffers go straight back to malloc.
  void* small = backend.allocate(1000);
  backend.deallocate(small, 1000);
  CHECK(cpu::cached_buffer_bytes() == size_class);

  // A size class nobody asks for is dropped by a miss after kIdleRequests requests.
  const size_t other = 2 * cpu::kMinCachedBytes;
  for (uint64_t i = 0; i <= cpu::kIdleRequests; ++i) backend.deallocate(backend.allocate(other), other);
  CHECK(cpu::cached_buffer_bytes() == size_class + other);  // the first class is still idle-kept
  void* third = backend.allocate(3 * cpu::kMinCachedBytes);  // a miss: idle buffers go
  CHECK(cpu::cached_buffer_bytes() == other);
  backend.deallocate(third, 3 * cpu::kMinCachedBytes);

  // Tensors go through the same cache.
  cpu::release_cached_buffers();
  const void* data = nullptr;
  {
    Tensor t = Tensor::empty({1 << 17}, DType::F32);  // 512 KiB
    data = t.data();
  }
  CHECK(cpu::cached_buffer_bytes() == size_t{1} << 19);
  Tensor again = Tensor::zeros({1 << 17}, DType::F32);
  CHECK(again.data() == data);
  CHECK(again.to_float_vector()[12345] == 0.0f);
  cpu::release_cached_buffers();
  CHECK(cpu::cached_buffer_bytes() == 0);
}

TEST_CASE("cpu buffer cache stops at its capacity", "[cpu_fast]") {
  Backend& backend = backend_for(kCPU);
  cpu::release_cached_buffers();
  const size_t chunk = size_t{64} << 20;
  const size_t count = cpu::kMaxCachedBytes / chunk + 2;
  std::vector<void*> held;
  for (size_t i = 0; i < count; ++i) held.push_back(backend.allocate(chunk));
  for (void* p : held) backend.deallocate(p, chunk);
  CHECK(cpu::cached_buffer_bytes() == cpu::kMaxCachedBytes / chunk * chunk);
  cpu::release_cached_buffers();
}
