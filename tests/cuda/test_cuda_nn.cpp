// Layout and neural-network primitives (permute, copy_narrow, softmax, cross-entropy, layer
// norm, embedding, dropout, pooling), forward and backward, CUDA against the CPU backend.
// Outputs are poisoned before every GPU call. Primitives that move values or repeat the
// CPU's arithmetic in its order are compared bit for bit; those whose reductions or libm
// calls differ are compared within the per-dtype tolerance, scaled by the magnitude of what
// was summed where a result cancels.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "backend_agreement.h"
#include "core/math/embedding_parts.h"
#include "cuda/cuda_backend.h"
#include "cuda/kernels/layout.h"

namespace {

using namespace mixprec;
using namespace mixprec::cuda_test;

// Row lengths: one value, a short row, a warp-owned row just below and at the 1024 limit (the
// latter in whole 16-byte packs), and block-owned rows with and without packs.
constexpr int64_t kColumns[] = {1, 7, 1023, 1024, 4096, 4097};

// The same tolerance with the absolute floor scaled to the size of the results (for outputs
// much smaller than 1, such as a gradient divided by the batch).
Tolerance scaled(DType dtype, double scale) {
  const Tolerance t = tolerance_for(dtype);
  return {t.rtol, t.atol * scale};
}

uint64_t syncs() { return dynamic_cast<CudaBackend&>(gpu_backend()).host_syncs(); }

// ---- magnitudes of the cancelling results, in double from the CPU's tensors ----------------

// softmax: |y_i| (|dy_i| + sum_k |y_k dy_k|); log-softmax: |dy_i| + exp(y_i) sum_k |dy_k|.
std::vector<float> softmax_backward_magnitude(const Tensor& y, const Tensor& dy, int64_t cols,
                                              bool log) {
  const std::vector<float> yv = y.to_float_vector(), g = dy.to_float_vector();
  std::vector<float> mag(yv.size());
  for (size_t r = 0; r * cols < yv.size(); ++r) {
    double dot = 0.0;
    for (int64_t j = 0; j < cols; ++j) {
      const size_t i = r * cols + j;
      dot += log ? std::fabs(g[i]) : std::fabs(static_cast<double>(yv[i]) * g[i]);
    }
    for (int64_t j = 0; j < cols; ++j) {
      const size_t i = r * cols + j;
      mag[i] = static_cast<float>(log ? std::fabs(g[i]) + std::exp(yv[i]) * dot
                                      : std::fabs(yv[i]) * (std::fabs(g[i]) + dot));
    }
  }
  return mag;
}

struct LayerNormMagnitudes {
  std::vector<float> dx, dweight, dbias;
};

// dx_i = rstd (g_i - mean g - xhat_i mean(g xhat)), g = dy * w: the size of each term.
// dweight_j and dbias_j: the sums of |dy xhat| and |dy| over the rows.
LayerNormMagnitudes layer_norm_magnitudes(const Tensor& x, const Tensor* w, const Tensor& mean,
                                          const Tensor& rstd, const Tensor& dy, int64_t cols) {
  const std::vector<float> xv = x.to_float_vector(), g = dy.to_float_vector();
  const std::vector<float> m = mean.to_float_vector(), rs = rstd.to_float_vector();
  const std::vector<float> wv = w ? w->to_float_vector() : std::vector<float>(cols, 1.0f);
  const size_t rows = m.size();
  LayerNormMagnitudes out{std::vector<float>(xv.size()), std::vector<float>(cols, 0.0f),
                          std::vector<float>(cols, 0.0f)};
  for (size_t r = 0; r < rows; ++r) {
    double sum_g = 0.0, sum_g_xhat = 0.0;
    for (int64_t j = 0; j < cols; ++j) {
      const size_t i = r * cols + j;
      const double xhat = (xv[i] - m[r]) * static_cast<double>(rs[r]);
      sum_g += std::fabs(g[i] * wv[j]);
      sum_g_xhat += std::fabs(g[i] * wv[j] * xhat);
      out.dweight[j] += static_cast<float>(std::fabs(g[i] * xhat));
      out.dbias[j] += std::fabs(g[i]);
    }
    for (int64_t j = 0; j < cols; ++j) {
      const size_t i = r * cols + j;
      const double xhat = (xv[i] - m[r]) * static_cast<double>(rs[r]);
      out.dx[i] = static_cast<float>(rs[r] * (std::fabs(g[i] * wv[j]) + sum_g / cols +
                                              std::fabs(xhat) * sum_g_xhat / cols));
    }
  }
  return out;
}

// ---- pooling cases ---------------------------------------------------------------------------

struct PoolCase {
  Shape x;
  int64_t kh, kw, sh, sw, ph, pw;
};

Pool2dDesc pool_desc(const PoolCase& c, PoolKind kind) {
  Pool2dDesc d;
  d.kind = kind;
  d.kernel_h = c.kh;
  d.kernel_w = c.kw;
  d.stride_h = c.sh;
  d.stride_w = c.sw;
  d.pad_h = c.ph;
  d.pad_w = c.pw;
  return d;
}

Shape pool_output(const PoolCase& c) {
  return {c.x[0], c.x[1], (c.x[2] + 2 * c.ph - c.kh) / c.sh + 1,
          (c.x[3] + 2 * c.pw - c.kw) / c.sw + 1};
}

// Non-overlapping windows that drop the last row and column, overlapping padded windows,
// rectangular kernels with unequal strides, a plane of one row, and windows lying wholly in
// the padding (kernel 1, padding 1: the border outputs cover no cell).
const std::vector<PoolCase>& pool_cases() {
  static const std::vector<PoolCase> cases = {
      {{2, 3, 7, 7}, 2, 2, 2, 2, 0, 0},   {{1, 2, 9, 11}, 3, 3, 2, 2, 1, 1},
      {{2, 2, 8, 8}, 3, 3, 1, 1, 1, 1},   {{2, 1, 13, 6}, 5, 5, 3, 3, 2, 2},
      {{1, 3, 6, 10}, 2, 3, 1, 2, 1, 0},  {{3, 1, 1, 33}, 1, 4, 1, 3, 0, 2},
      {{1, 1, 3, 3}, 1, 1, 1, 1, 1, 1}};
  return cases;
}

}  // namespace

// ---- layout -----------------------------------------------------------------------------------

TEST_CASE("cuda permute matches the CPU bit for bit for every dtype", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(41);
  struct Case {
    Shape x;
    std::vector<int64_t> perm;
  };
  // A matrix transpose (tiled path), head splits that keep the innermost dim, a full
  // reversal, extent-1 dims that merge away, and an identity; head merges whose innermost
  // runs move in 16-, 8- and 4-byte words (64, 4 and 6 elements: which word depends on the
  // dtype's size) and one whose outer strides allow only elements (3 elements of 2 bytes).
  const std::vector<Case> cases = {
      {{7, 1023}, {1, 0}},          {{33, 65}, {1, 0}},          {{2, 3, 4, 5}, {0, 2, 1, 3}},
      {{3, 1, 5, 7}, {3, 2, 0, 1}}, {{33, 65, 3}, {2, 0, 1}},    {{4097}, {0}},
      {{2, 1, 3}, {1, 2, 0}},       {{5, 6, 7, 8}, {0, 1, 3, 2}}, {{1, 1}, {1, 0}},
      {{2, 6, 17, 64}, {0, 2, 1, 3}}, {{3, 5, 4}, {1, 0, 2}},    {{4, 3, 6}, {1, 0, 2}},
      {{5, 7, 3}, {1, 0, 2}}};
  for (const Case& c : cases) {
    Shape ys;
    for (int64_t p : c.perm) ys.push_back(c.x[p]);
    for (DType dtype : {DType::F32, DType::F16, DType::BF16, DType::I32}) {
      INFO(dtype << " " << shape_str(c.x) << " by " << shape_str(c.perm));
      const Tensor x = dtype == DType::I32
                           ? Tensor::from_ints(random_ids(shape_numel(c.x), 1000, rng), c.x)
                           : random_tensor(c.x, dtype, rng);
      Tensor expected = Tensor::empty(ys, dtype);
      cpu_backend().permute(x, c.perm, expected);
      Tensor actual = poisoned(ys, dtype);
      gpu_backend().permute(on_gpu(x), c.perm, actual);
      expect_bits_equal(expected, actual);
    }
  }
}

TEST_CASE("cuda permute chooses the widest word its run, strides and pointers allow", "[cuda]") {
  // Host-side choice only: no device needed. Pointers are fake addresses of known alignment.
  const auto at = [](uintptr_t address) { return reinterpret_cast<const void*>(address); };
  const void* aligned = at(4096);
  const PermutePlan heads = plan_permute({2, 6, 17, 64}, {0, 2, 1, 3});  // runs of 64
  CHECK(kernels::permute_word_bytes(heads, 2, aligned, aligned) == 16);
  CHECK(kernels::permute_word_bytes(heads, 4, aligned, aligned) == 16);
  CHECK(kernels::permute_word_bytes(heads, 2, at(4096 + 8), aligned) == 8);
  CHECK(kernels::permute_word_bytes(heads, 2, aligned, at(4096 + 2)) == 2);
  CHECK(kernels::permute_word_bytes(heads, 4, at(4096 + 4), aligned) == 4);
  // Runs of 4 and 6 elements; of 3 two-byte elements (6 bytes, no word wider than one).
  CHECK(kernels::permute_word_bytes(plan_permute({3, 5, 4}, {1, 0, 2}), 2, aligned, aligned) == 8);
  CHECK(kernels::permute_word_bytes(plan_permute({4, 3, 6}, {1, 0, 2}), 2, aligned, aligned) == 4);
  CHECK(kernels::permute_word_bytes(plan_permute({4, 3, 6}, {1, 0, 2}), 4, aligned, aligned) == 8);
  CHECK(kernels::permute_word_bytes(plan_permute({5, 7, 3}, {1, 0, 2}), 2, aligned, aligned) == 2);
  // A transpose: the innermost output dim is strided in x, so elements.
  CHECK(kernels::permute_word_bytes(plan_permute({64, 64}, {1, 0}), 2, aligned, aligned) == 2);
  // The identity merges into one contiguous run.
  CHECK(kernels::permute_word_bytes(plan_permute({4097}, {0}), 4, aligned, aligned) == 4);
  CHECK(kernels::permute_word_bytes(plan_permute({4096}, {0}), 4, aligned, aligned) == 16);
}

TEST_CASE("cuda permute falls back to narrower words for misaligned pointers", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  // Tensors are 256-byte aligned; raw pointers offset by one element reach the narrower words
  // (a 64-element run of 2-byte elements then moves in 2-byte words, of 4-byte ones in 4).
  auto& backend = dynamic_cast<CudaBackend&>(gpu_backend());
  std::mt19937 rng(43);
  const Shape xs{3, 4, 64};
  const std::vector<int64_t> perm{1, 0, 2};
  const PermutePlan plan = plan_permute(xs, perm);
  const int64_t n = shape_numel(xs);
  for (DType dtype : {DType::F32, DType::F16}) {
    INFO(dtype);
    const size_t esize = dtype_size(dtype);
    const Tensor x = random_tensor({n + 1}, dtype, rng);
    Tensor expected = Tensor::empty({4, 3, 64}, dtype);
    const std::vector<float> values = x.to_float_vector();
    const Tensor body =
        Tensor::from_vector(std::vector<float>(values.begin() + 1, values.end()), xs, dtype);
    cpu_backend().permute(body, perm, expected);
    const Tensor xg = x.to(gpu());
    Tensor y = poisoned({n + 1}, dtype);
    kernels::permute(plan, esize, static_cast<const unsigned char*>(xg.data()) + esize,
                     static_cast<unsigned char*>(y.data()) + esize, n, backend.stream());
    const std::vector<uint32_t> e = element_bits(expected), a = element_bits(y);
    CHECK(a[0] == poison_bits(dtype));  // the element before the range is untouched
    CHECK(std::vector<uint32_t>(a.begin() + 1, a.end()) == e);
  }
}

TEST_CASE("cuda copy_narrow writes its range and keeps the rest of dst", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(42);
  struct Case {
    Shape src, dst;
    int64_t dim, src_start, dst_start, length;
  };
  // Outer, middle and inner dims; slices of 2-byte, 4-byte and 16-byte multiples; a
  // zero-length copy.
  const std::vector<Case> cases = {
      {{5, 7, 9}, {8, 7, 9}, 0, 1, 3, 4},     {{5, 7, 9}, {5, 10, 9}, 1, 2, 5, 5},
      {{5, 7, 9}, {5, 7, 4}, 2, 3, 1, 3},     {{3, 4097}, {3, 4100}, 1, 0, 1, 4097},
      {{6, 8}, {6, 16}, 1, 0, 8, 8},          {{2, 3, 1}, {2, 5, 1}, 1, 1, 4, 1},
      {{4, 1023}, {9, 1023}, 0, 0, 5, 4},     {{3, 5}, {3, 5}, 1, 2, 2, 0}};
  for (const Case& c : cases) {
    for (DType dtype : {DType::F32, DType::F16, DType::BF16, DType::I32}) {
      INFO(dtype << " " << shape_str(c.src) << " -> " << shape_str(c.dst) << " dim " << c.dim);
      const Tensor src = dtype == DType::I32
                             ? Tensor::from_ints(random_ids(shape_numel(c.src), 1000, rng), c.src)
                             : random_tensor(c.src, dtype, rng);
      Tensor expected = poisoned(c.dst, dtype, kCPU);
      cpu_backend().copy_narrow(src, c.dim, c.src_start, expected, c.dst_start, c.length);
      Tensor actual = poisoned(c.dst, dtype);
      gpu_backend().copy_narrow(on_gpu(src), c.dim, c.src_start, actual, c.dst_start, c.length);
      expect_bits_equal(expected, actual);
    }
  }
}

// ---- softmax ------------------------------------------------------------------------------------

TEST_CASE("cuda softmax and log-softmax match the CPU for odd row lengths", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(43);
  for (int64_t cols : kColumns) {
    for (const Shape& shape : {Shape{1, cols}, Shape{3, cols}, Shape{2, 5, cols}}) {
      for (DType dtype : kFloatingTypes) {
        for (bool log : {false, true}) {
          INFO(dtype << " " << shape_str(shape) << (log ? " log-softmax" : " softmax"));
          const Tensor x = random_tensor(shape, dtype, rng, -8.0f, 8.0f);
          Tensor expected = Tensor::empty(shape, dtype);
          cpu_backend().softmax(x, expected, log);
          Tensor actual = poisoned(shape, dtype);
          gpu_backend().softmax(on_gpu(x), actual, log);
          expect_close(expected, actual);
        }
      }
    }
  }
}

TEST_CASE("cuda softmax rows sum to one and keep NaN and -inf rows as the CPU", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // A row with a NaN, a row with a -inf entry (probability 0), and logits near the FP16
  // limit, whose exponents would overflow without the row maximum.
  const Tensor x = Tensor::from_vector({1.0f, nan, 2.0f, 0.5f, -inf, 1.0f, 3.0f, 0.0f,
                                        60000.0f, 59000.0f, 60000.0f, -60000.0f},
                                       {3, 4}, DType::F16);
  Tensor y = poisoned({3, 4}, DType::F16);
  gpu_backend().softmax(on_gpu(x), y, false);
  const std::vector<float> v = y.to_float_vector();
  const std::vector<uint32_t> bits = element_bits(y);
  for (int j = 0; j < 4; ++j) {
    CHECK(std::isnan(v[j]));
    CHECK(bits[j] != poison_bits(DType::F16));  // a computed NaN, not an unwritten element
  }
  CHECK(v[4] == 0.0f);
  CHECK(v[5] + v[6] + v[7] == Approx(1.0).epsilon(2e-3));
  CHECK(v[8] == Approx(0.5).epsilon(1e-3));
  CHECK(v[10] == Approx(0.5).epsilon(1e-3));
  CHECK(v[9] == 0.0f);
  CHECK(v[11] == 0.0f);
}

TEST_CASE("cuda softmax_backward matches the CPU for odd row lengths", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(44);
  for (int64_t cols : kColumns) {
    const Shape shape{3, cols};
    for (DType dtype : kFloatingTypes) {
      for (bool log : {false, true}) {
        INFO(dtype << " " << shape_str(shape) << (log ? " log-softmax" : " softmax"));
        const Tensor x = random_tensor(shape, dtype, rng, -4.0f, 4.0f);
        Tensor y = Tensor::empty(shape, dtype);
        cpu_backend().softmax(x, y, log);
        const Tensor dy = random_tensor(shape, dtype, rng);
        Tensor expected = Tensor::empty(shape, dtype);
        cpu_backend().softmax_backward(y, dy, expected, log);
        Tensor actual = poisoned(shape, dtype);
        gpu_backend().softmax_backward(on_gpu(y), on_gpu(dy), actual, log);
        expect_close(expected, actual, tolerance_for(dtype),
                     softmax_backward_magnitude(y, dy, cols, log));
      }
    }
  }
}

// ---- cross-entropy ------------------------------------------------------------------------------

TEST_CASE("cuda cross_entropy matches the CPU and the definition, without a host sync", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(45);
  for (int64_t cols : kColumns) {
    for (int64_t rows : {int64_t{1}, int64_t{7}, int64_t{33}}) {
      for (DType dtype : kFloatingTypes) {
        INFO(dtype << " [" << rows << ", " << cols << "]");
        const Tensor logits = random_tensor({rows, cols}, dtype, rng, -6.0f, 6.0f);
        const std::vector<int32_t> label_values = random_ids(rows, cols, rng);
        const Tensor labels = Tensor::from_ints(label_values, {rows});
        Tensor loss = Tensor::empty({}, DType::F32);
        Tensor stats = Tensor::empty({rows, 2}, DType::F32);
        cpu_backend().cross_entropy(logits, labels, loss, stats);

        const Tensor glogits = on_gpu(logits), glabels = on_gpu(labels);
        Tensor gloss = poisoned({}, DType::F32);
        Tensor gstats = poisoned({rows, 2}, DType::F32);
        const uint64_t before = syncs();
        gpu_backend().cross_entropy(glogits, glabels, gloss, gstats);
        CHECK(syncs() == before);
        // Everything is computed in FP32 (the sums in double) from the same inputs.
        expect_close(loss, gloss, tolerance_for(DType::F32));
        expect_close(stats, gstats, tolerance_for(DType::F32));
        // The row maxima are exact.
        const std::vector<float> s = stats.to_float_vector(), g = gstats.to_float_vector();
        for (int64_t r = 0; r < rows; ++r) CHECK(g[2 * r] == s[2 * r]);

        // The definition, in double: the mean of log(sum_j exp(x_j)) - x_label.
        const std::vector<float> xv = logits.to_float_vector();
        double total = 0.0;
        for (int64_t r = 0; r < rows; ++r) {
          double m = -std::numeric_limits<double>::infinity();
          for (int64_t j = 0; j < cols; ++j) m = std::max<double>(m, xv[r * cols + j]);
          double sum = 0.0;
          for (int64_t j = 0; j < cols; ++j) sum += std::exp(xv[r * cols + j] - m);
          total += m + std::log(sum) - xv[r * cols + label_values[r]];
        }
        const double reference = total / static_cast<double>(rows);
        CHECK(gloss.item() == Approx(reference).epsilon(1e-5).margin(1e-6));

        // The same inputs give the same bits on every run.
        Tensor again = poisoned({}, DType::F32);
        gpu_backend().cross_entropy(glogits, glabels, again, gstats);
        expect_bits_equal(gloss, again);
      }
    }
  }
}

TEST_CASE("cuda cross_entropy_backward matches the CPU and reads dloss on the device", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(46);
  const float dloss_value = 0.75f;
  for (int64_t cols : kColumns) {
    for (int64_t rows : {int64_t{1}, int64_t{7}, int64_t{33}}) {
      for (DType dtype : kFloatingTypes) {
        INFO(dtype << " [" << rows << ", " << cols << "]");
        const Tensor logits = random_tensor({rows, cols}, dtype, rng, -6.0f, 6.0f);
        const Tensor labels = Tensor::from_ints(random_ids(rows, cols, rng), {rows});
        Tensor loss = Tensor::empty({}, DType::F32);
        Tensor stats = Tensor::empty({rows, 2}, DType::F32);
        cpu_backend().cross_entropy(logits, labels, loss, stats);
        const Tensor dloss = Tensor::scalar(dloss_value, DType::F32);
        Tensor expected = Tensor::empty({rows, cols}, dtype);
        cpu_backend().cross_entropy_backward(logits, labels, stats, dloss, expected);

        const Tensor glogits = on_gpu(logits), glabels = on_gpu(labels);
        const Tensor gstats = on_gpu(stats), gdloss = on_gpu(dloss);
        Tensor actual = poisoned({rows, cols}, dtype);
        const uint64_t before = syncs();
        gpu_backend().cross_entropy_backward(glogits, glabels, gstats, gdloss, actual);
        CHECK(syncs() == before);
        // Every element is dloss / N times a difference of probabilities.
        expect_close(expected, actual, scaled(dtype, dloss_value / static_cast<double>(rows)));
      }
    }
  }
}

// ---- layer norm ---------------------------------------------------------------------------------

TEST_CASE("cuda layer_norm matches the CPU with any of its affine parameters", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(47);
  const float eps = 1e-5f;
  for (int64_t cols : kColumns) {
    for (const Shape& shape : {Shape{1, cols}, Shape{2, 3, cols}}) {
      for (DType dtype : kFloatingTypes) {
        // Bit 0: a weight; bit 1: a bias (a weight alone is GPT's bias: false).
        for (const int params : {0, 1, 2, 3}) {
          const bool with_weight = (params & 1) != 0, with_bias = (params & 2) != 0;
          INFO(dtype << " " << shape_str(shape) << (with_weight ? " with" : " without")
                     << " weight, " << (with_bias ? "with" : "without") << " bias");
          const int64_t rows = shape_numel(shape) / cols;
          const Tensor x = random_tensor(shape, dtype, rng, -3.0f, 5.0f);
          const Tensor w = random_tensor({cols}, dtype, rng, 0.5f, 1.5f);
          const Tensor b = random_tensor({cols}, dtype, rng);
          Tensor y = Tensor::empty(shape, dtype);
          Tensor mean = Tensor::empty({rows}, DType::F32), rstd = Tensor::empty({rows}, DType::F32);
          cpu_backend().layer_norm(x, with_weight ? &w : nullptr, with_bias ? &b : nullptr, eps,
                                   y, mean, rstd);

          const Tensor gw = on_gpu(w), gb = on_gpu(b);
          Tensor gy = poisoned(shape, dtype);
          Tensor gmean = poisoned({rows}, DType::F32), grstd = poisoned({rows}, DType::F32);
          gpu_backend().layer_norm(on_gpu(x), with_weight ? &gw : nullptr,
                                   with_bias ? &gb : nullptr, eps, gy, gmean, grstd);
          expect_close(y, gy);
          expect_close(mean, gmean, tolerance_for(DType::F32));
          expect_close(rstd, grstd, tolerance_for(DType::F32));
        }
      }
    }
  }
}

TEST_CASE("cuda layer_norm_backward matches the CPU, parameter gradients included", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(48);
  // Row counts below and above one split of the parameter-gradient reduction.
  const std::vector<Shape> shapes = {{1, 7},   {7, 1},    {7, 1023}, {3, 1024},
                                     {130, 33}, {4097, 7}, {3, 4097}};
  for (const Shape& shape : shapes) {
    const int64_t rows = shape[0], cols = shape[1];
    for (DType dtype : kFloatingTypes) {
      for (bool affine : {false, true}) {
        INFO(dtype << " " << shape_str(shape) << (affine ? " with" : " without") << " weight");
        const Tensor x = random_tensor(shape, dtype, rng, -3.0f, 5.0f);
        const Tensor w = random_tensor({cols}, dtype, rng, 0.5f, 1.5f);
        const Tensor dy = random_tensor(shape, dtype, rng);
        const Tensor* weight = affine ? &w : nullptr;
        Tensor y = Tensor::empty(shape, dtype);
        Tensor mean = Tensor::empty({rows}, DType::F32), rstd = Tensor::empty({rows}, DType::F32);
        cpu_backend().layer_norm(x, weight, nullptr, 1e-5f, y, mean, rstd);
        Tensor dx = Tensor::empty(shape, dtype);
        Tensor dw = Tensor::empty({cols}, dtype), db = Tensor::empty({cols}, dtype);
        cpu_backend().layer_norm_backward(x, weight, mean, rstd, dy, dx, &dw, &db);

        const Tensor gx = on_gpu(x), gw = on_gpu(w), gdy = on_gpu(dy);
        const Tensor gmean = on_gpu(mean), grstd = on_gpu(rstd);
        Tensor gdx = poisoned(shape, dtype);
        Tensor gdw = poisoned({cols}, dtype), gdb = poisoned({cols}, dtype);
        gpu_backend().layer_norm_backward(gx, affine ? &gw : nullptr, gmean, grstd, gdy, gdx,
                                          &gdw, &gdb);
        const LayerNormMagnitudes mag = layer_norm_magnitudes(x, weight, mean, rstd, dy, cols);
        expect_close(dx, gdx, tolerance_for(dtype), mag.dx);
        expect_close(dw, gdw, tolerance_for(dtype), mag.dweight);
        expect_close(db, gdb, tolerance_for(dtype), mag.dbias);

        // Without parameter gradients only dx is written; the sums are the same on every run.
        Tensor again = poisoned(shape, dtype);
        gpu_backend().layer_norm_backward(gx, affine ? &gw : nullptr, gmean, grstd, gdy, again,
                                          nullptr, nullptr);
        expect_bits_equal(gdx, again);
        Tensor dw_again = poisoned({cols}, dtype);
        gpu_backend().layer_norm_backward(gx, affine ? &gw : nullptr, gmean, grstd, gdy, again,
                                          &dw_again, nullptr);
        expect_bits_equal(gdw, dw_again);
        Tensor db_again = poisoned({cols}, dtype);
        gpu_backend().layer_norm_backward(gx, affine ? &gw : nullptr, gmean, grstd, gdy, again,
                                          nullptr, &db_again);
        expect_bits_equal(gdb, db_again);
      }
    }
  }
}

// ---- embedding ----------------------------------------------------------------------------------

TEST_CASE("cuda embedding gathers the CPU's rows bit for bit", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(49);
  const int64_t vocab = 11;
  for (int64_t dim : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{1023}, int64_t{4097}}) {
    for (DType dtype : kFloatingTypes) {
      INFO(dtype << " dim " << dim);
      const Tensor weight = random_tensor({vocab, dim}, dtype, rng);
      // Repeated ids, the first and the last row.
      std::vector<int32_t> id_values = random_ids(15, vocab, rng);
      id_values[0] = 0;
      id_values[1] = static_cast<int32_t>(vocab - 1);
      id_values[2] = id_values[3];
      const Tensor ids = Tensor::from_ints(id_values, {3, 5});
      Tensor expected = Tensor::empty({3, 5, dim}, dtype);
      cpu_backend().embedding(weight, ids, expected);
      Tensor actual = poisoned({3, 5, dim}, dtype);
      gpu_backend().embedding(on_gpu(weight), on_gpu(ids), actual);
      expect_bits_equal(expected, actual);
    }
  }
}

TEST_CASE("cuda embedding_backward sums repeated ids in the CPU's order, bit for bit", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(50);
  struct Case {
    int64_t count, vocab, dim;
    bool in_parts;  // whether each row is summed in more than one part
    bool skewed;    // every third position holds id 1
  };
  // One id; repeats with unused rows (which must be zeroed); many repeats of few ids, whose
  // rows are summed in parts (core/math/embedding_parts.h); a long row; a character
  // corpus's skew, where one id holds a third of the positions.
  const std::vector<Case> cases = {
      {1, 5, 7, false, false},    {37, 11, 8, false, false},    {4097, 50, 7, true, false},
      {300, 3, 33, true, false},  {9, 4, 4097, false, false},   {64, 1000, 1, false, false},
      {20000, 65, 24, true, true}};
  for (const Case& c : cases) {
    const int64_t parts = embedding_backward_parts(c.count, c.vocab, c.dim);
    CHECK((parts > 1) == c.in_parts);
    for (DType dtype : kFloatingTypes) {
      INFO(dtype << " " << c.count << " ids into [" << c.vocab << ", " << c.dim << "], "
                 << parts << " parts per row");
      std::vector<int32_t> id_values = random_ids(c.count, c.vocab, rng);
      // Keep the last row unused when there is more than one.
      for (int32_t& id : id_values)
        if (c.vocab > 1 && id == c.vocab - 1) id = 0;
      if (c.skewed) {
        for (size_t i = 0; i < id_values.size(); i += 3) id_values[i] = 1;
      }
      const Tensor ids = Tensor::from_ints(id_values, {c.count});
      const Tensor dy = random_tensor({c.count, c.dim}, dtype, rng);
      Tensor expected = Tensor::empty({c.vocab, c.dim}, dtype);
      cpu_backend().embedding_backward(ids, dy, expected);
      const Tensor gids = on_gpu(ids), gdy = on_gpu(dy);
      Tensor actual = poisoned({c.vocab, c.dim}, dtype);
      gpu_backend().embedding_backward(gids, gdy, actual);
      expect_bits_equal(expected, actual);
      Tensor again = poisoned({c.vocab, c.dim}, dtype);
      gpu_backend().embedding_backward(gids, gdy, again);
      expect_bits_equal(actual, again);
    }
  }
  // By hand: ids {2, 0, 2, 2} with dy rows 1, 2, 4, 8 give row 2 = 13, row 0 = 2, row 1 = 0.
  const Tensor ids = Tensor::from_ints({2, 0, 2, 2}, {4}, gpu());
  const Tensor dy = Tensor::from_vector({1.0f, 2.0f, 4.0f, 8.0f}, {4, 1}, DType::F32, gpu());
  Tensor dweight = poisoned({3, 1}, DType::F32);
  gpu_backend().embedding_backward(ids, dy, dweight);
  CHECK(dweight.to_float_vector() == std::vector<float>{2.0f, 0.0f, 13.0f});
}

// ---- dropout ------------------------------------------------------------------------------------

TEST_CASE("cuda dropout draws the CPU's mask from the same key", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(51);
  const PhiloxKey key{0x1234ABCDull, 977};
  for (float p : {0.0f, 0.1f, 0.5f, 0.9f}) {
    for (DType dtype : kFloatingTypes) {
      for (int64_t n : kOddSizes) {
        INFO(dtype << " [" << n << "] p " << p);
        // Any offset: the thread per Philox block starts at element 0 whatever it is.
        const PhiloxKey even{key.seed, 4096};
        Tensor expected_even = Tensor::empty({n}, dtype);
        Tensor actual_even = poisoned({n}, dtype);
        const Tensor x = random_tensor({n}, dtype, rng);
        cpu_backend().dropout(x, p, even, expected_even);
        gpu_backend().dropout(on_gpu(x), p, even, actual_even);
        expect_bits_equal(expected_even, actual_even);
        Tensor expected = Tensor::empty({n}, dtype);
        cpu_backend().dropout(x, p, key, expected);
        Tensor actual = poisoned({n}, dtype);
        gpu_backend().dropout(on_gpu(x), p, key, actual);
        expect_bits_equal(expected, actual);
        // In place, as the backward may run on its own buffer.
        Tensor inplace = on_gpu(x);
        gpu_backend().dropout(inplace, p, key, inplace);
        expect_bits_equal(expected, inplace);
      }
    }
  }
  // Another offset is another mask.
  const Tensor ones = Tensor::ones({4097}, DType::F32, gpu());
  Tensor a = poisoned({4097}, DType::F32), b = poisoned({4097}, DType::F32);
  gpu_backend().dropout(ones, 0.5f, key, a);
  gpu_backend().dropout(ones, 0.5f, PhiloxKey{key.seed, key.offset + 4097}, b);
  CHECK(a.to_float_vector() != b.to_float_vector());
}

TEST_CASE("cuda dropout_add gives the CPU's bits, over its residual or input too", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(52);
  const PhiloxKey key{0x5EEDull, 123};
  for (float p : {0.0f, 0.2f, 0.7f}) {
    for (DType dtype : kFloatingTypes) {
      for (int64_t n : kOddSizes) {
        INFO(dtype << " [" << n << "] p " << p);
        const Tensor residual = random_tensor({n}, dtype, rng);
        const Tensor x = random_tensor({n}, dtype, rng);
        Tensor expected = Tensor::empty({n}, dtype);
        cpu_backend().dropout_add(residual, x, p, key, expected);
        Tensor actual = poisoned({n}, dtype);
        gpu_backend().dropout_add(on_gpu(residual), on_gpu(x), p, key, actual);
        expect_bits_equal(expected, actual);
        Tensor over_residual = on_gpu(residual);
        gpu_backend().dropout_add(over_residual, on_gpu(x), p, key, over_residual);
        expect_bits_equal(expected, over_residual);
        Tensor over_input = on_gpu(x);
        gpu_backend().dropout_add(on_gpu(residual), over_input, p, key, over_input);
        expect_bits_equal(expected, over_input);
      }
    }
  }
}

// ---- pooling ------------------------------------------------------------------------------------

TEST_CASE("cuda max pooling matches the CPU's values and argmax bit for bit", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(52);
  for (const PoolCase& c : pool_cases()) {
    const Pool2dDesc desc = pool_desc(c, PoolKind::Max);
    const Shape ys = pool_output(c);
    for (DType dtype : kFloatingTypes) {
      INFO(dtype << " " << shape_str(c.x) << " kernel " << c.kh << "x" << c.kw << " stride "
                 << c.sh << "x" << c.sw << " padding " << c.ph << "x" << c.pw);
      // Few distinct values, so windows hold ties (the first cell wins), and one NaN.
      Tensor x = random_tensor(c.x, dtype, rng, -2.0f, 2.0f);
      std::vector<float> values = x.to_float_vector();
      for (float& v : values) v = std::round(v);
      values[values.size() / 2] = std::numeric_limits<float>::quiet_NaN();
      x = Tensor::from_vector(values, c.x, dtype);
      Tensor y = Tensor::empty(ys, dtype), argmax = Tensor::empty(ys, DType::I32);
      cpu_backend().pool2d(desc, x, y, &argmax);
      Tensor gy = poisoned(ys, dtype), gargmax = poisoned(ys, DType::I32);
      gpu_backend().pool2d(desc, on_gpu(x), gy, &gargmax);
      expect_bits_equal(y, gy);
      expect_bits_equal(argmax, gargmax);
      // Without an argmax output.
      Tensor plain = poisoned(ys, dtype);
      gpu_backend().pool2d(desc, on_gpu(x), plain, nullptr);
      expect_bits_equal(y, plain);

      // The backward routes each dy to its argmax: the CPU's sums in the CPU's order.
      const Tensor dy = random_tensor(ys, dtype, rng);
      Tensor dx = Tensor::empty(c.x, dtype);
      cpu_backend().pool2d_backward(desc, dy, &argmax, dx);
      Tensor gdx = poisoned(c.x, dtype);
      const Tensor gargmax_in = on_gpu(argmax);
      gpu_backend().pool2d_backward(desc, on_gpu(dy), &gargmax_in, gdx);
      expect_bits_equal(dx, gdx);
    }
  }
}

TEST_CASE("cuda average pooling matches the CPU, forward and backward", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(53);
  for (const PoolCase& c : pool_cases()) {
    const Pool2dDesc desc = pool_desc(c, PoolKind::Avg);
    const Shape ys = pool_output(c);
    for (DType dtype : kFloatingTypes) {
      INFO(dtype << " " << shape_str(c.x) << " kernel " << c.kh << "x" << c.kw << " stride "
                 << c.sh << "x" << c.sw << " padding " << c.ph << "x" << c.pw);
      const Tensor x = random_tensor(c.x, dtype, rng);
      Tensor y = Tensor::empty(ys, dtype);
      cpu_backend().pool2d(desc, x, y, nullptr);
      Tensor gy = poisoned(ys, dtype);
      gpu_backend().pool2d(desc, on_gpu(x), gy, nullptr);
      expect_close(y, gy);

      const Tensor dy = random_tensor(ys, dtype, rng);
      Tensor dx = Tensor::empty(c.x, dtype);
      cpu_backend().pool2d_backward(desc, dy, nullptr, dx);
      Tensor gdx = poisoned(c.x, dtype);
      gpu_backend().pool2d_backward(desc, on_gpu(dy), nullptr, gdx);
      expect_close(dx, gdx);
    }
  }
  // By hand: a 2x2 average over [[1, 2], [3, 4]] is 2.5; its backward spreads dy / 4.
  const Pool2dDesc desc = pool_desc({{1, 1, 2, 2}, 2, 2, 2, 2, 0, 0}, PoolKind::Avg);
  Tensor y = poisoned({1, 1, 1, 1}, DType::F32);
  gpu_backend().pool2d(desc, Tensor::from_vector({1, 2, 3, 4}, {1, 1, 2, 2}, DType::F32, gpu()),
                       y, nullptr);
  CHECK(y.item() == 2.5);
  Tensor dx = poisoned({1, 1, 2, 2}, DType::F32);
  gpu_backend().pool2d_backward(desc, Tensor::full({1, 1, 1, 1}, 2.0, DType::F32, gpu()), nullptr,
                                dx);
  CHECK(dx.to_float_vector() == std::vector<float>{0.5f, 0.5f, 0.5f, 0.5f});
}

TEST_CASE("cuda nn primitives refuse tensors on the wrong device or of the wrong shape",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  const Tensor cpu_x = Tensor::ones({2, 3});
  Tensor y = Tensor::empty({2, 3}, DType::F32, gpu());
  CHECK_THROWS_WITH(gpu_backend().softmax(cpu_x, y, false), Catch::Contains("softmax") &&
                                                                 Catch::Contains("is not on"));
  Tensor small = Tensor::empty({2, 2}, DType::F32, gpu());
  CHECK_THROWS_WITH(gpu_backend().softmax(on_gpu(cpu_x), small, false),
                    Catch::Contains("softmax"));
  Tensor mean = Tensor::empty({3}, DType::F32, gpu()), rstd = Tensor::empty({2}, DType::F32, gpu());
  CHECK_THROWS_WITH(
      gpu_backend().layer_norm(on_gpu(cpu_x), nullptr, nullptr, 1e-5f, y, mean, rstd),
      Catch::Contains("layer_norm"));
  CHECK_THROWS_WITH(gpu_backend().dropout(on_gpu(cpu_x), 1.0f, PhiloxKey{}, y),
                    Catch::Contains("dropout"));
}
