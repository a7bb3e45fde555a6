// Broadcasting, broadcast reductions, expansion, permutation, narrow copies, the row
// kernels (softmax, layer norm, attention softmax on non-square scores), GEMMs, convolutions
// and pooling on shapes drawn at random (a fixed seed, so a failure repeats), CUDA against
// the CPU backend: the fixed cases of the other files pick the patterns their authors thought
// of, these the ones nobody did (ranks 0 to 5, extents of 1 anywhere, runs of kept and
// broadcast dims that merge or do not, odd sizes that leave vector tails, rows up to 5000,
// geometries the ops cannot express). Cross entropy, embedding and the heads' split and merge
// on random shapes are the op table's large draws (tests/ops/).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "backend_agreement.h"
#include "core/ops/gemm_desc.h"
#include "gemm_magnitude.h"

namespace mixprec::cuda_test {
namespace {

constexpr int kCases = 40;

// A shape of rank 0 to max_rank, extents mostly 1 to 9, now and then up to 40.
Shape random_shape(std::mt19937& rng, int max_rank) {
  std::uniform_int_distribution<int> rank(0, max_rank), small(1, 9), large(10, 40), pick(0, 7);
  Shape shape(static_cast<size_t>(rank(rng)));
  for (int64_t& extent : shape) extent = pick(rng) == 0 ? large(rng) : small(rng);
  return shape;
}

// A shape that broadcasts to `full`: some leading dims dropped, some others set to 1.
Shape broadcast_operand(const Shape& full, std::mt19937& rng) {
  std::uniform_int_distribution<size_t> dropped(0, full.size());
  std::bernoulli_distribution to_one(0.4);
  Shape shape(full.begin() + static_cast<std::ptrdiff_t>(dropped(rng)), full.end());
  for (int64_t& extent : shape)
    if (to_one(rng)) extent = 1;
  return shape;
}

std::string case_label(int index, const Shape& a, const Shape& b, DType dtype) {
  return "case " + std::to_string(index) + ": " + shape_str(a) + " and " + shape_str(b) + ", " +
         std::string(dtype_name(dtype));
}

TEST_CASE("cuda binary matches the CPU on random broadcast shapes", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(101);
  const BinaryOp ops[] = {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div};
  for (int index = 0; index < kCases; ++index) {
    const Shape out = random_shape(rng, 5);
    const Shape sa = broadcast_operand(out, rng), sb = broadcast_operand(out, rng);
    // The result's shape is out only where some operand keeps each of its extents.
    const Shape result = broadcast_shapes(sa, sb, "test");
    for (DType dtype : kFloatingTypes) {
      INFO(case_label(index, sa, sb, dtype));
      const Tensor a = random_tensor(sa, dtype, rng);
      const Tensor b = random_tensor(sb, dtype, rng, 0.5f, 2.0f);
      const Tensor ga = a.to(gpu()), gb = b.to(gpu());
      for (const BinaryOp op : ops) {
        INFO("op " << static_cast<int>(op));
        expect_backends_agree_bitwise(result, dtype, [&](Backend& backend, Device device,
                                                         Tensor& out) {
          backend.binary(op, device.is_cpu() ? a : ga, device.is_cpu() ? b : gb, out);
        });
      }
    }
  }
}

TEST_CASE("cuda sum_to and expand match the CPU on random broadcast shapes", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(102);
  for (int index = 0; index < kCases; ++index) {
    const Shape xs = random_shape(rng, 5);
    const Shape ys = broadcast_operand(xs, rng);
    for (DType dtype : kFloatingTypes) {
      INFO(case_label(index, xs, ys, dtype));
      const Tensor x = random_tensor(xs, dtype, rng);
      // sum_to: summation orders differ, so within the dtype's tolerance of the magnitudes.
      Tensor sums = Tensor::empty(ys, dtype);
      cpu_backend().sum_to(x, sums, 0.75f);
      Tensor gpu_sums = poisoned(ys, dtype);
      gpu_backend().sum_to(x.to(gpu()), gpu_sums, 0.75f);
      Tensor magnitudes = Tensor::empty(ys, DType::F32);
      cpu_backend().sum_to(abs_of(x), magnitudes, 0.75f);
      expect_close(sums, gpu_sums, tolerance_for(dtype), magnitudes.to_float_vector());
      // expand: one product and one rounding, the same bits.
      const Tensor small = random_tensor(ys, dtype, rng);
      expect_backends_agree_bitwise(xs, dtype, [&](Backend& backend, Device device, Tensor& out) {
        backend.expand(small.to(device), out, -1.25f);
      });
    }
  }
}

TEST_CASE("cuda permute and copy_narrow match the CPU on random shapes", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(103);
  const DType dtypes[] = {DType::F32, DType::F16, DType::BF16, DType::I32};
  for (int index = 0; index < kCases; ++index) {
    Shape xs = random_shape(rng, 5);
    if (xs.empty()) xs = {3};
    std::vector<int64_t> perm(xs.size());
    std::iota(perm.begin(), perm.end(), int64_t{0});
    std::shuffle(perm.begin(), perm.end(), rng);
    Shape ys(xs.size());
    for (size_t d = 0; d < xs.size(); ++d) ys[d] = xs[static_cast<size_t>(perm[d])];
    // A narrow copy along a random dim into a destination longer along it.
    std::uniform_int_distribution<size_t> dim_of(0, xs.size() - 1);
    const auto dim = static_cast<int64_t>(dim_of(rng));
    const int64_t extent = xs[static_cast<size_t>(dim)];
    std::uniform_int_distribution<int64_t> start_of(0, extent - 1), extra_of(0, 5);
    const int64_t src_start = start_of(rng);
    const int64_t length = std::uniform_int_distribution<int64_t>(0, extent - src_start)(rng);
    const int64_t dst_start = extra_of(rng);
    Shape ds = xs;
    ds[static_cast<size_t>(dim)] = dst_start + length + extra_of(rng);
    for (const DType dtype : dtypes) {
      INFO("case " << index << ": " << shape_str(xs) << " permuted, and narrowed along dim "
                   << dim << " from " << src_start << " for " << length << " into "
                   << shape_str(ds) << " at " << dst_start << ", " << dtype);
      const Tensor x = random_tensor(xs, DType::F32, rng, -100.0f, 100.0f).to(dtype);
      expect_backends_agree_bitwise(ys, dtype, [&](Backend& backend, Device device, Tensor& out) {
        backend.permute(x.to(device), perm, out);
      });

      // The destination's other elements are kept: both start from the same values.
      const Tensor before = random_tensor(ds, DType::F32, rng, -100.0f, 100.0f).to(dtype);
      Tensor narrowed = before.clone();
      cpu_backend().copy_narrow(x, dim, src_start, narrowed, dst_start, length);
      Tensor gpu_narrowed = before.to(gpu());
      gpu_backend().copy_narrow(x.to(gpu()), dim, src_start, gpu_narrowed, dst_start, length);
      expect_bits_equal(narrowed, gpu_narrowed);
    }
  }
}

// Rows of a random length (1 to 40, or now and then up to 5000, so that the row kernels'
// per-lane and per-block layouts all occur) under 0 to 3 random leading dims.
Shape random_rows(std::mt19937& rng) {
  std::uniform_int_distribution<int> pick(0, 3), small(1, 40), large(41, 5000);
  const Shape leading = random_shape(rng, 3);
  // Few rows when they are long: the emulated device runs every thread on the CPU.
  const int64_t cols = pick(rng) == 0 ? large(rng) : small(rng);
  const size_t kept = cols > 40 ? std::min<size_t>(leading.size(), 1) : leading.size();
  Shape shape(leading.begin(), leading.begin() + static_cast<std::ptrdiff_t>(kept));
  shape.push_back(cols);
  return shape;
}

TEST_CASE("cuda softmax, log-softmax and layer norm match the CPU on random row shapes",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(104);
  for (int index = 0; index < kCases; ++index) {
    const Shape shape = random_rows(rng);
    const int64_t cols = shape.back(), rows = shape_numel(shape) / cols;
    for (DType dtype : kFloatingTypes) {
      INFO("case " << index << ": " << shape_str(shape) << ", " << dtype);
      const Tensor x = random_tensor(shape, dtype, rng, -6.0f, 6.0f);
      const Tensor gx = x.to(gpu());
      for (const bool log : {false, true}) {
        INFO((log ? "log-softmax" : "softmax"));
        Tensor expected = Tensor::empty(shape, dtype);
        cpu_backend().softmax(x, expected, log);
        Tensor actual = poisoned(shape, dtype);
        gpu_backend().softmax(gx, actual, log);
        expect_close(expected, actual);
      }
      const Tensor w = random_tensor({cols}, dtype, rng, 0.5f, 1.5f);
      const Tensor b = random_tensor({cols}, dtype, rng);
      Tensor y = Tensor::empty(shape, dtype);
      Tensor mean = Tensor::empty({rows}, DType::F32), rstd = Tensor::empty({rows}, DType::F32);
      cpu_backend().layer_norm(x, &w, &b, 1e-5f, y, mean, rstd);
      const Tensor gw = w.to(gpu()), gb = b.to(gpu());
      Tensor gy = poisoned(shape, dtype);
      Tensor gmean = poisoned({rows}, DType::F32), grstd = poisoned({rows}, DType::F32);
      gpu_backend().layer_norm(gx, &gw, &gb, 1e-5f, gy, gmean, grstd);
      expect_close(y, gy);
      expect_close(mean, gmean, tolerance_for(DType::F32));
      expect_close(rstd, grstd, tolerance_for(DType::F32));
    }
  }
}

// One convolution problem drawn at random: 1 to 3 images of 1 to 5 channels, 1 to 13 pixels
// a side (at least the filter's extent less its padding), filters of 1 to 5 a side, padding
// up to half the filter, strides 1 to 3, on each axis independently.
struct RandomConv {
  Shape x, w, y;
  Conv2dDesc desc;
};

RandomConv random_conv(std::mt19937& rng) {
  std::uniform_int_distribution<int64_t> batch(1, 3), channels(1, 5), kernel(1, 5), stride(1, 3);
  RandomConv r;
  const int64_t n = batch(rng), c = channels(rng), o = channels(rng);
  const int64_t kh = kernel(rng), kw = kernel(rng);
  r.desc.pad_h = std::uniform_int_distribution<int64_t>(0, kh / 2)(rng);
  r.desc.pad_w = std::uniform_int_distribution<int64_t>(0, kw / 2)(rng);
  r.desc.stride_h = stride(rng);
  r.desc.stride_w = stride(rng);
  const int64_t h = std::uniform_int_distribution<int64_t>(
      std::max<int64_t>(1, kh - 2 * r.desc.pad_h), 13)(rng);
  const int64_t w = std::uniform_int_distribution<int64_t>(
      std::max<int64_t>(1, kw - 2 * r.desc.pad_w), 13)(rng);
  r.x = {n, c, h, w};
  r.w = {o, c, kh, kw};
  r.y = {n, o, (h + 2 * r.desc.pad_h - kh) / r.desc.stride_h + 1,
         (w + 2 * r.desc.pad_w - kw) / r.desc.stride_w + 1};
  return r;
}

TEST_CASE("cuda conv2d passes match the CPU on random geometries", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(105);
  for (int index = 0; index < kCases; ++index) {
    const RandomConv p = random_conv(rng);
    const int64_t c = p.x[1], o = p.w[0], kh = p.w[2], kw = p.w[3];
    for (DType dtype : kFloatingTypes) {
      INFO("case " << index << ": x " << shape_str(p.x) << ", w " << shape_str(p.w)
                   << ", stride " << p.desc.stride_h << "x" << p.desc.stride_w << ", padding "
                   << p.desc.pad_h << "x" << p.desc.pad_w << ", " << dtype);
      const Tensor x = random_tensor(p.x, dtype, rng), w = random_tensor(p.w, dtype, rng);
      const Tensor dy = random_tensor(p.y, dtype, rng), bias = random_tensor({o}, dtype, rng);
      const Tensor gx = x.to(gpu()), gw = w.to(gpu()), gdy = dy.to(gpu()), gbias = bias.to(gpu());
      // Each pass's magnitudes: the same pass over the absolute values, in F32.
      const Tensor ax = abs_of(x), aw = abs_of(w), ady = abs_of(dy), abias = abs_of(bias);

      Tensor y = Tensor::empty(p.y, dtype), y_mag = Tensor::empty(p.y, DType::F32);
      cpu_backend().conv2d(x, w, &bias, p.desc, y);
      cpu_backend().conv2d(ax, aw, &abias, p.desc, y_mag);
      Tensor gy = poisoned(p.y, dtype);
      gpu_backend().conv2d(gx, gw, &gbias, p.desc, gy);
      expect_close(y, gy, accumulation_tolerance(dtype, c * kh * kw), y_mag.to_float_vector());

      Tensor dx = Tensor::empty(p.x, dtype), dx_mag = Tensor::empty(p.x, DType::F32);
      cpu_backend().conv2d_backward_data(dy, w, p.desc, dx);
      cpu_backend().conv2d_backward_data(ady, aw, p.desc, dx_mag);
      Tensor gdx = poisoned(p.x, dtype);
      gpu_backend().conv2d_backward_data(gdy, gw, p.desc, gdx);
      expect_close(dx, gdx, accumulation_tolerance(dtype, o * kh * kw), dx_mag.to_float_vector());

      Tensor dw = Tensor::empty(p.w, dtype), dw_mag = Tensor::empty(p.w, DType::F32);
      Tensor db = Tensor::empty({o}, dtype), db_mag = Tensor::empty({o}, DType::F32);
      cpu_backend().conv2d_backward_filter(x, dy, p.desc, dw, &db);
      cpu_backend().conv2d_backward_filter(ax, ady, p.desc, dw_mag, &db_mag);
      Tensor gdw = poisoned(p.w, dtype), gdb = poisoned({o}, dtype);
      gpu_backend().conv2d_backward_filter(gx, gdy, p.desc, gdw, &gdb);
      const int64_t terms = p.y[0] * p.y[2] * p.y[3];
      expect_close(dw, gdw, accumulation_tolerance(dtype, terms), dw_mag.to_float_vector());
      expect_close(db, gdb, accumulation_tolerance(dtype, terms), db_mag.to_float_vector());
    }
  }
}

TEST_CASE("cuda max and average pooling match the CPU on random geometries", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(106);
  std::uniform_int_distribution<int64_t> batch(1, 3), channels(1, 5), kernel(1, 4), stride(1, 3);
  for (int index = 0; index < kCases; ++index) {
    Pool2dDesc desc;
    desc.kernel_h = kernel(rng);
    desc.kernel_w = kernel(rng);
    desc.stride_h = stride(rng);
    desc.stride_w = stride(rng);
    desc.pad_h = std::uniform_int_distribution<int64_t>(0, desc.kernel_h / 2)(rng);
    desc.pad_w = std::uniform_int_distribution<int64_t>(0, desc.kernel_w / 2)(rng);
    const int64_t h = std::uniform_int_distribution<int64_t>(
        std::max<int64_t>(1, desc.kernel_h - 2 * desc.pad_h), 13)(rng);
    const int64_t w = std::uniform_int_distribution<int64_t>(
        std::max<int64_t>(1, desc.kernel_w - 2 * desc.pad_w), 13)(rng);
    const Shape xs{batch(rng), channels(rng), h, w};
    const Shape ys{xs[0], xs[1], (h + 2 * desc.pad_h - desc.kernel_h) / desc.stride_h + 1,
                   (w + 2 * desc.pad_w - desc.kernel_w) / desc.stride_w + 1};
    for (DType dtype : kFloatingTypes) {
      INFO("case " << index << ": x " << shape_str(xs) << ", kernel " << desc.kernel_h << "x"
                   << desc.kernel_w << ", stride " << desc.stride_h << "x" << desc.stride_w
                   << ", padding " << desc.pad_h << "x" << desc.pad_w << ", " << dtype);
      // Whole numbers in [-2, 2], so that windows hold ties (the first cell wins).
      std::vector<float> values = random_tensor(xs, DType::F32, rng).to_float_vector();
      for (float& v : values) v = std::round(v);
      const Tensor x = Tensor::from_vector(values, xs, dtype), gx = x.to(gpu());
      const Tensor dy = random_tensor(ys, dtype, rng), gdy = dy.to(gpu());

      desc.kind = PoolKind::Max;
      Tensor y = Tensor::empty(ys, dtype), argmax = Tensor::empty(ys, DType::I32);
      cpu_backend().pool2d(desc, x, y, &argmax);
      Tensor gy = poisoned(ys, dtype), gargmax = poisoned(ys, DType::I32);
      gpu_backend().pool2d(desc, gx, gy, &gargmax);
      expect_bits_equal(y, gy);
      expect_bits_equal(argmax, gargmax);
      Tensor dx = Tensor::empty(xs, dtype);
      cpu_backend().pool2d_backward(desc, dy, &argmax, dx);
      Tensor gdx = poisoned(xs, dtype);
      gpu_backend().pool2d_backward(desc, gdy, &gargmax, gdx);
      expect_bits_equal(dx, gdx);

      desc.kind = PoolKind::Avg;
      cpu_backend().pool2d(desc, x, y, nullptr);
      poison(gy);
      gpu_backend().pool2d(desc, gx, gy, nullptr);
      expect_close(y, gy);
      cpu_backend().pool2d_backward(desc, dy, nullptr, dx);
      poison(gdx);
      gpu_backend().pool2d_backward(desc, gdy, nullptr, gdx);
      expect_close(dx, gdx);
    }
  }
}

TEST_CASE("cuda gemm matches the CPU on random problems", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(107);
  // Operand and output dtypes as the backend takes them.
  constexpr DType kTypes[][2] = {{DType::F32, DType::F32}, {DType::F16, DType::F16},
                                 {DType::F16, DType::F32}, {DType::BF16, DType::BF16},
                                 {DType::BF16, DType::F32}};
  std::uniform_int_distribution<int64_t> extent(1, 70), batch_of(1, 3), gap(0, 5);
  std::uniform_int_distribution<int> type_of(0, 4);
  std::bernoulli_distribution coin(0.5);
  for (int index = 0; index < kCases; ++index) {
    GemmDesc d;
    d.m = extent(rng);
    d.n = extent(rng);
    d.k = extent(rng);
    d.trans_a = coin(rng);
    d.trans_b = coin(rng);
    d.batch = batch_of(rng);
    // Batches apart by their size or more (an odd gap misaligns every later matrix), or A
    // shared by the whole batch.
    d.stride_a = coin(rng) ? 0 : d.m * d.k + gap(rng);
    d.stride_b = d.k * d.n + gap(rng);
    d.stride_c = d.m * d.n + gap(rng);
    d.alpha = coin(rng) ? 1.0f : -0.75f;
    d.beta = coin(rng) ? 0.0f : 0.5f;
    const auto& types = kTypes[type_of(rng)];
    INFO("case " << index << ": " << d.m << "x" << d.n << "x" << d.k << ", trans "
                 << d.trans_a << d.trans_b << ", batch " << d.batch << ", strides "
                 << d.stride_a << "/" << d.stride_b << "/" << d.stride_c << ", alpha "
                 << d.alpha << ", beta " << d.beta << ", " << types[0] << " -> " << types[1]);
    const Tensor a = random_tensor({(d.batch - 1) * d.stride_a + d.m * d.k}, types[0], rng);
    const Tensor b = random_tensor({(d.batch - 1) * d.stride_b + d.k * d.n}, types[0], rng);
    const Shape cs{(d.batch - 1) * d.stride_c + d.m * d.n};
    // C: random where beta reads it; otherwise poisoned on both sides, so gap elements must
    // keep the poison and every matrix element must be written.
    Tensor c0 = d.beta != 0.0f ? random_tensor(cs, types[1], rng) : Tensor::empty(cs, types[1]);
    if (d.beta == 0.0f) poison(c0);
    Tensor expected = c0.clone();
    cpu_backend().gemm(d, a, b, expected);
    Tensor actual = c0.to(gpu());
    gpu_backend().gemm(d, a.to(gpu()), b.to(gpu()), actual);
    expect_close(expected, actual, accumulation_tolerance(types[1], d.k),
                 gemm_magnitude(d, a, b, c0));
  }
}

// Scores of R rows and C columns, R != C: the causal_attention op (whose rows are the op
// table's, tests/ops/) only ever makes square ones.
TEST_CASE("cuda attention softmax matches the CPU on random non-square score shapes", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(109);
  std::uniform_int_distribution<int64_t> extent(1, 4), length(1, 300);
  std::bernoulli_distribution with_dropout(0.5);
  const PhiloxKey key{1234, 77};
  for (int index = 0; index < kCases; ++index) {
    // Scores [B, H, R, C] of any R and C (the mask is causal over the last two dims).
    const Shape shape{extent(rng), extent(rng), length(rng) / 4 + 1, length(rng)};
    const float p = with_dropout(rng) ? 0.2f : 0.0f;
    for (DType dtype : kFloatingTypes) {
      INFO("case " << index << ": scores " << shape_str(shape) << ", p " << p << ", " << dtype);
      const Tensor scores = random_tensor(shape, DType::F32, rng, -6.0f, 6.0f);
      Tensor probs = Tensor::empty(shape, DType::F32), operand = Tensor::empty(shape, dtype);
      cpu_backend().attention_softmax(scores, p, key, probs, operand);
      Tensor gprobs = poisoned(shape, DType::F32), goperand = poisoned(shape, dtype);
      gpu_backend().attention_softmax(scores.to(gpu()), p, key, gprobs, goperand);
      expect_close(probs, gprobs);
      expect_close(operand, goperand);
      // The backward from the CPU's probabilities: each row's values are O(1) sums of the
      // row's products, so within the dtype's tolerance.
      const Tensor dprobs = random_tensor(shape, DType::F32, rng);
      Tensor ds = Tensor::empty(shape, dtype);
      cpu_backend().attention_softmax_backward(probs, dprobs, p, key, ds);
      Tensor gds = poisoned(shape, dtype);
      gpu_backend().attention_softmax_backward(probs.to(gpu()), dprobs.to(gpu()), p, key, gds);
      expect_close(ds, gds);
    }
  }
}

}  // namespace
}  // namespace mixprec::cuda_test
