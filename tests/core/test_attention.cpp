// causal_attention: forward against a double-loop reference, causality (no output depends on
// a later position), gradients at shapes the op table does not draw, F16/BF16 against F32
// at 8 positions of width 8 (longer than the table's) and with scores beyond the F16 range,
// and input validation.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/autograd/grad_mode.h"
#include "gradcheck.h"

namespace mixprec {
namespace {

using Catch::Contains;
using namespace testing;

std::vector<double> reference_attention(const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t bh = q.size(0) * q.size(1), t = q.size(2), d = q.size(3);
  const std::vector<float> vq = q.to_float_vector(), vk = k.to_float_vector(), vv = v.to_float_vector();
  std::vector<double> out(vq.size(), 0.0);
  for (int64_t b = 0; b < bh; ++b) {
    const int64_t base = b * t * d;
    for (int64_t i = 0; i < t; ++i) {
      std::vector<double> s(i + 1);
      double m = -INFINITY;
      for (int64_t j = 0; j <= i; ++j) {  // the causal mask: only positions j <= i
        double dot = 0;
        for (int64_t e = 0; e < d; ++e) dot += (double)vq[base + i * d + e] * vk[base + j * d + e];
        s[j] = dot / std::sqrt((double)d);
        m = std::max(m, s[j]);
      }
      double z = 0;
      for (int64_t j = 0; j <= i; ++j) z += std::exp(s[j] - m);
      for (int64_t j = 0; j <= i; ++j) {
        const double p = std::exp(s[j] - m) / z;
        for (int64_t e = 0; e < d; ++e) out[base + i * d + e] += p * vv[base + j * d + e];
      }
    }
  }
  return out;
}

TEST_CASE("causal_attention matches a double-loop reference", "[nn][attention]") {
  for (const Shape& shape : {Shape{2, 3, 5, 4}, Shape{1, 1, 1, 3}, Shape{1, 2, 13, 7}, Shape{3, 1, 4, 1}}) {
    const Tensor q = random_tensor(shape, 1, -2.f, 2.f), k = random_tensor(shape, 2, -2.f, 2.f),
                 v = random_tensor(shape, 3);
    const Tensor out = ops::causal_attention(q, k, v);
    REQUIRE(out.shape() == shape);
    REQUIRE(out.dtype() == DType::F32);
    const std::vector<double> ref = reference_attention(q, k, v);
    const std::vector<float> got = out.to_float_vector();
    for (size_t i = 0; i < ref.size(); ++i) REQUIRE(got[i] == Approx(ref[i]).margin(1e-5));
  }
}

TEST_CASE("causal_attention outputs do not depend on later positions", "[nn][attention]") {
  const Shape shape{2, 2, 9, 4};
  const int64_t t = 9, d = 4, t0 = 5;
  const Tensor q = random_tensor(shape, 4, -2.f, 2.f), k = random_tensor(shape, 5, -2.f, 2.f),
               v = random_tensor(shape, 6);
  const std::vector<float> before = ops::causal_attention(q, k, v).to_float_vector();
  Tensor k2 = k.clone(), v2 = v.clone(), q2 = q.clone();
  for (int64_t bh = 0; bh < 4; ++bh)
    for (int64_t e = 0; e < d; ++e) {
      const int64_t at = (bh * t + t0) * d + e;
      k2.set(at, k.get(at) + 3.0);
      v2.set(at, v.get(at) - 5.0);
      q2.set(at, q.get(at) * -2.0);
    }
  const std::vector<float> after = ops::causal_attention(q2, k2, v2).to_float_vector();
  int64_t changed_later = 0;
  for (int64_t bh = 0; bh < 4; ++bh)
    for (int64_t i = 0; i < t; ++i)
      for (int64_t e = 0; e < d; ++e) {
        const int64_t at = (bh * t + i) * d + e;
        if (i < t0) REQUIRE(after[at] == before[at]);
        else if (after[at] != before[at]) ++changed_later;
      }
  // The perturbation is real: every position from t0 on sees it.
  CHECK(changed_later == 4 * (t - t0) * d);
}

// The op table checks the gradients at up to 5 positions of width up to 4; here 7 positions
// of width 1 (one score per pair, scale 1), and v the only input needing a gradient.
TEST_CASE("causal_attention gradients: 7 positions of width 1, and v alone", "[nn][attention]") {
  const Shape shape{1, 1, 7, 1};
  Tensor q7 = random_tensor(shape, 7, -1.f, 1.f).set_requires_grad(true);
  Tensor k7 = random_tensor(shape, 8, -1.f, 1.f).set_requires_grad(true);
  Tensor v7 = random_tensor(shape, 9).set_requires_grad(true);
  gradcheck("causal_attention",
            [](const std::vector<Tensor>& in) { return ops::causal_attention(in[0], in[1], in[2]); },
            {q7, k7, v7});
  // Only v needing a gradient.
  const Tensor q = random_tensor({1, 1, 4, 2}, 10), k = random_tensor({1, 1, 4, 2}, 11);
  Tensor v = random_tensor({1, 1, 4, 2}, 12).set_requires_grad(true);
  gradcheck("causal_attention dv",
            [&](const std::vector<Tensor>& in) { return ops::causal_attention(q, k, in[0]); }, {v});
}

// The same computation spelled out with separate ops: scores, mask, softmax, ops::dropout on
// the F32 probabilities (drawing the same counters from a generator in the same state), P v.
Tensor composed_attention_with_dropout(const Tensor& q, const Tensor& k, const Tensor& v, double p,
                                       Generator& gen) {
  const int64_t t = q.size(2), d = q.size(3);
  std::vector<float> mask(static_cast<size_t>(t * t), 0.0f);
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = i + 1; j < t; ++j) mask[i * t + j] = -INFINITY;
  const Tensor scores = ops::add(ops::mul_scalar(ops::matmul(q, k, false, true), 1.0 / std::sqrt(double(d))),
                                 Tensor::from_vector(mask, {t, t}));
  return ops::matmul(ops::dropout(ops::softmax(scores), p, true, gen), v);
}

TEST_CASE("causal_attention with dropout equals dropout on the probabilities, forward and backward",
          "[nn][attention]") {
  const Shape shape{2, 3, 6, 4};
  for (double p : {0.25, 0.5}) {
    INFO("p = " << p);
    Tensor q = random_tensor(shape, 31).set_requires_grad(true);
    Tensor k = random_tensor(shape, 32).set_requires_grad(true);
    Tensor v = random_tensor(shape, 33).set_requires_grad(true);
    Tensor q2 = q.detach().clone().set_requires_grad(true);
    Tensor k2 = k.detach().clone().set_requires_grad(true);
    Tensor v2 = v.detach().clone().set_requires_grad(true);
    Generator fused_gen(77), composed_gen(77);
    fused_gen.next(5);  // any state, as long as both start from it
    composed_gen.next(5);
    const Tensor fused = ops::causal_attention(q, k, v, p, true, fused_gen);
    const Tensor composed = composed_attention_with_dropout(q2, k2, v2, p, composed_gen);
    CHECK(fused_gen.offset() == composed_gen.offset());  // the same counters were drawn
    require_close(fused, composed, 1e-5, 1e-6, "forward");
    // The mask really drops: the output differs from attention without dropout.
    const Tensor plain = ops::causal_attention(q.detach(), k.detach(), v.detach());
    CHECK(fused.to_float_vector() != plain.to_float_vector());

    const Tensor weights = random_tensor(shape, 34);
    ops::sum(ops::mul(fused, weights)).backward();
    ops::sum(ops::mul(composed, weights)).backward();
    require_close(q.grad(), q2.grad(), 1e-5, 1e-6, "dq");
    require_close(k.grad(), k2.grad(), 1e-5, 1e-6, "dk");
    require_close(v.grad(), v2.grad(), 1e-5, 1e-6, "dv");
  }
  // Not training, or p = 0: the plain op, and no counters drawn.
  const Tensor q = random_tensor(shape, 41), k = random_tensor(shape, 42), v = random_tensor(shape, 43);
  Generator gen(1);
  for (const auto& [p, training] : {std::pair{0.5, false}, std::pair{0.0, true}}) {
    const Tensor out = ops::causal_attention(q, k, v, p, training, gen);
    CHECK(out.to_float_vector() == ops::causal_attention(q, k, v).to_float_vector());
  }
  CHECK(gen.offset() == 0);
  CHECK_THROWS_WITH(ops::causal_attention(q, k, v, 1.0, true, gen), Contains("dropout must be in [0, 1)"));
}

TEST_CASE("causal_attention in F16 and BF16 matches F32", "[nn][attention]") {
  const Shape shape{2, 2, 8, 8};
  const Tensor q = random_tensor(shape, 13, -1.f, 1.f), k = random_tensor(shape, 14, -1.f, 1.f),
               v = random_tensor(shape, 15);
  const auto f = [](const std::vector<Tensor>& in) { return ops::causal_attention(in[0], in[1], in[2]); };
  for (DType dtype : {DType::F16, DType::BF16}) {
    check_low_precision("causal_attention", f, {q, k, v}, dtype, 2.0);
    const double tol = 4 * low_precision_rtol(dtype);
    check_low_precision_grads("causal_attention", f, {q, k, v},
                              random_tensor(shape, 16, -1.f, 1.f, dtype), dtype, tol,
                              {tol, tol, tol});
  }
}

TEST_CASE("causal_attention keeps F16/BF16 scores in FP32: no overflow past 65504",
          "[nn][attention]") {
  // q k^T / sqrt(D) = 200 * 200 * 4 / 2 = 80000, beyond the largest finite F16 (65504): scores
  // stored in F16 would be inf and the softmax NaN. Every score is equal, so the output is v.
  const Shape shape{1, 1, 3, 4};
  // Row i averages i + 1 equal positions: dV at position j sums 1 / (i + 1) over i >= j.
  const std::vector<double> dv_expected = {1.0 + 1.0 / 2 + 1.0 / 3, 1.0 / 2 + 1.0 / 3, 1.0 / 3};
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    INFO(dtype_name(dtype));
    Tensor q = Tensor::full(shape, 200.0, dtype).set_requires_grad(true);
    Tensor k = Tensor::full(shape, 200.0, dtype).set_requires_grad(true);
    Tensor v = Tensor::full(shape, 200.0, dtype).set_requires_grad(true);
    const Tensor out = ops::causal_attention(q, k, v);
    REQUIRE(out.dtype() == dtype);
    const double rtol = low_precision_rtol(dtype);
    for (int64_t i = 0; i < out.numel(); ++i) REQUIRE(out.get(i) == Approx(200.0).epsilon(rtol));

    // dP = dO V^T = 800 everywhere, so dS = P (dP - sum P dP) vanishes and dQ = dK = 0.
    out.backward(Tensor::ones(shape, dtype));
    for (int64_t i = 0; i < out.numel(); ++i) {
      CHECK(std::abs(q.grad().get(i)) <= 1e-2);
      CHECK(std::abs(k.grad().get(i)) <= 1e-2);
      CHECK(v.grad().get(i) == Approx(dv_expected[static_cast<size_t>(i / 4)]).epsilon(rtol));
    }
  }
}

TEST_CASE("causal_attention with scaled F16 scores beyond 65504 matches the reference",
          "[nn][attention]") {
  // Multiples of 4 up to 348 in magnitude are exact in F16 and BF16 and their dot products
  // exact in FP32, so the 16-bit runs see the very scores of the F32 run. k is q plus a small
  // perturbation, so the diagonal scores |q_i|^2 / 2 are large and often beyond the F16 range.
  const Shape shape{2, 1, 9, 4};
  const int64_t bh = 2, t = 9, d = 4;
  const auto multiples_of_4 = [&](uint64_t seed, float range) {
    std::vector<float> values = random_tensor(shape, seed, -range, range).to_float_vector();
    for (float& x : values) x = 4.0f * std::round(x);
    return Tensor::from_vector(values, shape);
  };
  const Tensor q = multiples_of_4(21, 75.f);
  const Tensor k = ops::add(q, multiples_of_4(22, 12.f));
  const Tensor v = random_tensor(shape, 23);
  // Rows whose largest score exceeds 65504: an F16 score there would be inf, the softmax NaN.
  const std::vector<float> vq = q.to_float_vector(), vk = k.to_float_vector();
  int64_t rows_beyond_f16 = 0;
  for (int64_t b = 0; b < bh; ++b)
    for (int64_t i = 0; i < t; ++i) {
      double row_max = -INFINITY;
      for (int64_t j = 0; j <= i; ++j) {
        double dot = 0;
        for (int64_t e = 0; e < d; ++e)
          dot += static_cast<double>(vq[(b * t + i) * d + e]) * vk[(b * t + j) * d + e];
        row_max = std::max(row_max, dot / std::sqrt(static_cast<double>(d)));
      }
      if (row_max > 65504.0) ++rows_beyond_f16;
    }
  REQUIRE(rows_beyond_f16 >= 3);

  const auto f = [](const std::vector<Tensor>& in) {
    return ops::causal_attention(in[0], in[1], in[2]);
  };
  for (DType dtype : {DType::F16, DType::BF16}) {
    INFO(dtype_name(dtype));
    const Tensor vl = v.to(dtype);
    const Tensor out = ops::causal_attention(q.to(dtype), k.to(dtype), vl);
    REQUIRE(out.dtype() == dtype);
    // Explicitly: the comparisons below compute relative errors, where a NaN is no excess.
    for (float x : out.to_float_vector()) REQUIRE(std::isfinite(x));
    require_matches(out, reference_attention(q, k, vl.to(DType::F32)), low_precision_rtol(dtype),
                    "forward against the double reference");
    check_low_precision("causal_attention", f, {q, k, v}, dtype, 2.0);
    // dQ and dK carry the factors K / sqrt(D) and Q / sqrt(D), up to 174 here.
    const double tol = 4 * low_precision_rtol(dtype);
    const LowPrecisionGrads grads =
        low_precision_grads(f, {q, k, v}, random_tensor(shape, 24, -1.f, 1.f, dtype), dtype);
    const std::vector<double> atols = {175 * tol, 175 * tol, tol};
    for (size_t i = 0; i < 3; ++i) {
      for (float x : grads.low[i].to_float_vector()) REQUIRE(std::isfinite(x));
      require_close(grads.low[i], grads.reference[i], tol, atols[i],
                    "causal_attention grad " + std::to_string(i));
    }
  }
}

TEST_CASE("causal_attention rejects bad input", "[nn][attention]") {
  const Tensor q = random_tensor({1, 2, 3, 4}, 1);
  REQUIRE_THROWS_WITH(ops::causal_attention(q, random_tensor({1, 2, 4, 4}, 2), q),
                      Contains("causal_attention") && Contains("F32[1, 2, 4, 4]"));
  REQUIRE_THROWS_WITH(ops::causal_attention(q, q, q.to(DType::F16)),
                      Contains("causal_attention") && Contains("F16[1, 2, 3, 4]"));
  const Tensor q3 = random_tensor({2, 3, 4}, 3);
  REQUIRE_THROWS_WITH(ops::causal_attention(q3, q3, q3),
                      Contains("causal_attention") && Contains("F32[2, 3, 4]"));
  const Tensor ids = Tensor::zeros({1, 2, 3, 4}).to(DType::I32);
  REQUIRE_THROWS_WITH(ops::causal_attention(ids, ids, ids),
                      Contains("causal_attention") && Contains("I32[1, 2, 3, 4]"));
  REQUIRE_THROWS_WITH(ops::causal_attention(Tensor(), q, q),
                      Contains("causal_attention") && Contains("undefined"));
}

}  // namespace
}  // namespace mixprec
