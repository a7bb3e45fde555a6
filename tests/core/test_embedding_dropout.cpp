// embedding (lookup, deterministic scatter-sum backward) and dropout (reproducible masks,
// drop rate, scaling, backward through the same mask).
#include <cmath>
#include <cstring>
#include <vector>

#include "core/autograd/grad_mode.h"
#include "core/backend.h"
#include "core/math/dropout.h"
#include "core/math/embedding_parts.h"
#include "gradcheck.h"
#include "tests/tensor_bytes.h"

namespace mixprec {
namespace {

using Catch::Contains;
using namespace testing;
using mixprec_test::raw_bytes;

// ---- embedding ----------------------------------------------------------------------------

TEST_CASE("embedding looks up rows for ids of any shape", "[nn][embedding]") {
  const Tensor weight = random_tensor({5, 3}, 1);
  const Tensor ids = Tensor::from_ints({4, 0, 2, 2, 1, 4}, {2, 3});
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    const Tensor w = weight.to(dtype);
    const Tensor y = ops::embedding(w, ids);
    REQUIRE(y.shape() == Shape{2, 3, 3});
    REQUIRE(y.dtype() == dtype);
    const std::vector<int32_t> id = ids.to_int_vector();
    for (int64_t i = 0; i < 6; ++i)
      for (int64_t j = 0; j < 3; ++j) REQUIRE(y.get(i * 3 + j) == w.get(id[i] * 3 + j));
  }
  const Tensor single = ops::embedding(weight, Tensor::from_ints({3}, {}));
  REQUIRE(single.shape() == Shape{3});
  CHECK(single.get(2) == weight.get(11));
}

TEST_CASE("embedding backward sums the gradients of repeated ids", "[nn][embedding]") {
  const int64_t vocab = 6, dim = 4;
  const std::vector<int32_t> id{1, 3, 1, 1, 5, 3, 0};
  const Tensor ids = Tensor::from_ints(id, {7});
  const Tensor dy = random_tensor({7, dim}, 2);
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    Tensor w = random_tensor({vocab, dim}, 3, -1.f, 1.f, dtype).set_requires_grad(true);
    ops::embedding(w, ids).backward(dy.to(dtype));
    const Tensor g = w.grad();
    REQUIRE(g.dtype() == dtype);
    const std::vector<float> vdy = dy.to(dtype).to_float_vector();
    for (int64_t v = 0; v < vocab; ++v)
      for (int64_t j = 0; j < dim; ++j) {
        double ref = 0;
        for (size_t i = 0; i < id.size(); ++i)
          if (id[i] == v) ref += vdy[i * dim + j];
        const double tol = dtype == DType::F32 ? 1e-6 : low_precision_rtol(dtype);
        REQUIRE(g.get(v * dim + j) == Approx(ref).margin(tol));
      }
    // Rows no id points at get an exact zero.
    for (int64_t j = 0; j < dim; ++j) CHECK(g.get(2 * dim + j) == 0.0);
  }
}

TEST_CASE("embedding backward is deterministic on many repeated ids", "[nn][embedding]") {
  const int64_t vocab = 50, dim = 64, count = 4000;
  std::vector<int32_t> id(count);
  for (int64_t i = 0; i < count; ++i) id[i] = static_cast<int32_t>((i * i + 3 * i) % 7 == 0 ? 0 : i % vocab);
  const Tensor ids = Tensor::from_ints(id, {count});
  const Tensor dy = random_tensor({count, dim}, 4);
  std::vector<float> first;
  for (int run = 0; run < 3; ++run) {
    Tensor w = Tensor::zeros({vocab, dim}).set_requires_grad(true);
    ops::embedding(w, ids).backward(dy);
    const std::vector<float> g = w.grad().to_float_vector();
    if (run == 0) first = g;
    else REQUIRE(g == first);
  }
  // Row 0 sums over its positions in order; check against double.
  const std::vector<float> vdy = dy.to_float_vector();
  for (int64_t j = 0; j < dim; ++j) {
    double ref = 0;
    for (int64_t i = 0; i < count; ++i)
      if (id[i] == 0) ref += vdy[i * dim + j];
    REQUIRE(first[j] == Approx(ref).margin(1e-4));
  }
}

TEST_CASE("embedding backward cuts each row's positions into parts that cover it in order",
          "[nn][embedding]") {
  // About one part per four positions of an average row, capped at kEmbeddingMaxParts and by
  // the partial sums' bound; one part for anything degenerate.
  CHECK(embedding_backward_parts(16384, 65, 384) == 63);
  CHECK(embedding_backward_parts(16384, 256, 384) == 16);
  CHECK(embedding_backward_parts(1 << 20, 3, 8) == kEmbeddingMaxParts);
  CHECK(embedding_backward_parts(1 << 20, 1000, 50000) == 1);  // the partials would not fit
  CHECK(embedding_backward_parts(7, 5, 3) == 1);
  CHECK(embedding_backward_parts(0, 5, 3) == 1);
  CHECK(embedding_backward_parts(100, 0, 3) == 1);
  for (int64_t count : {1, 5, 4097, 20000}) {
    for (int64_t vocab : {1, 3, 65}) {
      const int64_t parts = embedding_backward_parts(count, vocab, 24);
      REQUIRE(parts >= 1);
      REQUIRE(parts * vocab * 24 <= kEmbeddingMaxPartialFloats);
      // Every run length, shorter than the part count included: consecutive parts, from 0
      // to the run's end, never going back.
      for (int64_t length : {int64_t{0}, int64_t{1}, parts - 1, parts, parts + 1, count}) {
        if (length < 0) continue;
        INFO("count " << count << " vocab " << vocab << " length " << length);
        REQUIRE(embedding_part_begin(length, 0, parts) == 0);
        REQUIRE(embedding_part_begin(length, parts, parts) == length);
        for (int64_t s = 0; s < parts; ++s) {
          REQUIRE(embedding_part_begin(length, s, parts) <=
                  embedding_part_begin(length, s + 1, parts));
        }
      }
    }
  }
}

TEST_CASE("embedding rejects bad input", "[nn][embedding]") {
  const Tensor w = random_tensor({5, 3}, 1);
  REQUIRE_THROWS_WITH(ops::embedding(w, Tensor::from_ints({0, 1, 2, 3, 9}, {5})),
                      Contains("embedding") && Contains("9") && Contains("index 4") &&
                          Contains("[0, 5)"));
  REQUIRE_THROWS_WITH(ops::embedding(w, Tensor::from_ints({0, -2}, {1, 2})),
                      Contains("embedding") && Contains("-2") && Contains("index 1"));
  REQUIRE_THROWS_WITH(ops::embedding(w, Tensor::zeros({2, 3})),
                      Contains("embedding") && Contains("ids") && Contains("F32[2, 3]"));
  REQUIRE_THROWS_WITH(ops::embedding(random_tensor({15}, 1), Tensor::from_ints({0}, {1})),
                      Contains("embedding") && Contains("F32[15]"));
  REQUIRE_THROWS_WITH(ops::embedding(w, Tensor()), Contains("embedding") && Contains("undefined"));
}

// ---- dropout ------------------------------------------------------------------------------

TEST_CASE("dropout drops a fraction p and scales survivors by 1/(1-p)", "[nn][dropout]") {
  const int64_t n = 100000;
  const Tensor x = random_tensor({n}, 6, 1.f, 2.f);
  for (double p : {0.1, 0.5, 0.8}) {
    Generator gen(123);
    const Tensor y = ops::dropout(x, p, true, gen);
    REQUIRE(y.dtype() == DType::F32);
    CHECK(gen.offset() == static_cast<uint64_t>(n));
    const std::vector<float> vx = x.to_float_vector(), vy = y.to_float_vector();
    int64_t dropped = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (vy[i] == 0.f) {
        ++dropped;
      } else {
        REQUIRE(vy[i] == Approx(vx[i] / (1.0 - p)).epsilon(1e-6));
      }
    }
    // Binomial(n, p): six standard deviations.
    const double fraction = static_cast<double>(dropped) / n;
    CHECK(std::abs(fraction - p) < 6 * std::sqrt(p * (1 - p) / n));
  }
}

TEST_CASE("dropout masks are reproducible from the generator state", "[nn][dropout]") {
  const Tensor x = random_tensor({3, 1000}, 7, 1.f, 2.f);
  Generator a(42), b(42), c(43);
  const std::vector<float> ya = ops::dropout(x, 0.5, true, a).to_float_vector();
  CHECK(ya == ops::dropout(x, 0.5, true, b).to_float_vector());
  CHECK(ya != ops::dropout(x, 0.5, true, c).to_float_vector());
  // The next call draws fresh counters.
  CHECK(ya != ops::dropout(x, 0.5, true, a).to_float_vector());
  // The mask depends only on the key, not the dtype.
  for (DType dtype : {DType::F16, DType::BF16}) {
    Generator g(42);
    const std::vector<float> yl = ops::dropout(x.to(dtype), 0.5, true, g).to_float_vector();
    for (size_t i = 0; i < ya.size(); ++i) REQUIRE((yl[i] == 0.f) == (ya[i] == 0.f));
  }
}

TEST_CASE("dropout backward applies the forward mask", "[nn][dropout]") {
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    Tensor x = random_tensor({7, 13}, 8, 1.f, 2.f, dtype).set_requires_grad(true);
    Generator gen(9);
    const double p = 0.3;
    Tensor y = ops::dropout(x, p, true, gen);
    y.backward(Tensor::ones(y.shape(), dtype));
    const Tensor g = x.grad();
    REQUIRE(g.dtype() == dtype);
    int64_t kept = 0;
    for (int64_t i = 0; i < x.numel(); ++i) {
      if (y.get(i) == 0.0) {
        REQUIRE(g.get(i) == 0.0);
      } else {
        ++kept;
        REQUIRE(g.get(i) == Approx(1.0 / (1.0 - p)).epsilon(low_precision_rtol(dtype)));
      }
    }
    CHECK(kept > 0);
    CHECK(kept < x.numel());
  }
}

TEST_CASE("dropout keeps element i by word i % 4 of the Philox block at offset + i / 4",
          "[nn][dropout]") {
  const uint64_t seed = 0x5EEDull;
  const float p = 0.5f;
  // The rule itself, from the Philox words.
  const auto expected_keep = [&](uint64_t offset, uint64_t i) {
    const uint32_t word = philox4x32(seed, offset + i / 4).v[i % 4];
    return static_cast<float>(word >> 8) / 16777216.0f >= p;
  };
  for (uint64_t offset : {0ull, 1ull, 2ull, 3ull, 4097ull}) {
    for (int64_t n : {1, 3, 4, 5, 8, 9, 4099, 9000}) {
      INFO("offset " << offset << " n " << n);
      const PhiloxKey key{seed, offset};
      const Tensor x = Tensor::ones({n}, DType::F32);
      Tensor y = Tensor::empty({n}, DType::F32);
      backend_for(kCPU).dropout(x, p, key, y);
      int64_t kept = 0;
      for (int64_t i = 0; i < n; ++i) {
        const bool rule = expected_keep(offset, static_cast<uint64_t>(i));
        REQUIRE(dropout_keep(key, static_cast<uint64_t>(i), p) == rule);
        REQUIRE((y.get(i) != 0.0) == rule);
        kept += rule ? 1 : 0;
      }
      if (n >= 4099) CHECK(std::abs(static_cast<double>(kept) / n - 0.5) < 0.05);
      // A run that starts inside a block (a row of attention's scores) keeps the same rule.
      for (uint64_t first : {0ull, 1ull, 2ull, 3ull}) {
        if (static_cast<int64_t>(first) >= n) continue;
        std::vector<uint8_t> keep(static_cast<size_t>(n), 2);
        fill_dropout_keep(key, first, n - static_cast<int64_t>(first), p, keep.data());
        for (int64_t i = 0; i + static_cast<int64_t>(first) < n; ++i) {
          REQUIRE(static_cast<bool>(keep[static_cast<size_t>(i)]) ==
                  expected_keep(offset, first + static_cast<uint64_t>(i)));
        }
      }
    }
  }
  // The blocks stay inside the counters the call reserved: a mask of n elements at offset k
  // never evaluates a block at or beyond k + n, where the next call's draws begin.
  CHECK(dropout_block(PhiloxKey{seed, 10}, 0) == 10);
  CHECK(dropout_block(PhiloxKey{seed, 10}, 4) == 11);
  for (uint64_t n = 1; n < 40; ++n) CHECK(dropout_block(PhiloxKey{seed, 10}, n - 1) < 10 + n);
  // A thread's cache of its last block gives the same decisions in any order of asking.
  DropoutDraws draws;
  const PhiloxKey key{seed, 7};
  for (uint64_t i : {9ull, 8ull, 11ull, 3ull, 10ull, 9ull, 400ull, 2ull}) {
    CHECK(draws.keep(key, i, p) == expected_keep(7, i));
  }
}

TEST_CASE("dropout is the identity when p == 0 or not training", "[nn][dropout]") {
  const Tensor x = random_tensor({4, 4}, 12);
  Generator gen(1);
  CHECK(ops::dropout(x, 0.0, true, gen).is_same(x));
  CHECK(ops::dropout(x, 0.5, false, gen).is_same(x));
  CHECK(gen.offset() == 0);
}

TEST_CASE("dropout rejects bad input", "[nn][dropout]") {
  const Tensor x = random_tensor({4, 4}, 12);
  Generator gen(1);
  REQUIRE_THROWS_WITH(ops::dropout(x, 1.0, true, gen), Contains("dropout") && Contains("p must be"));
  REQUIRE_THROWS_WITH(ops::dropout(x, -0.1, true, gen), Contains("dropout") && Contains("-0.1"));
  REQUIRE_THROWS_WITH(ops::dropout(x, NAN, true, gen), Contains("dropout") && Contains("p must be"));
  REQUIRE_THROWS_WITH(ops::dropout(Tensor::from_ints({1, 2}, {2}), 0.5, true, gen),
                      Contains("dropout") && Contains("I32[2]"));
  REQUIRE_THROWS_WITH(ops::dropout(Tensor(), 0.5, true, gen),
                      Contains("dropout") && Contains("undefined"));
}

TEST_CASE("embedding rejects an empty list of ids", "[nn]") {
  const Tensor weight = Tensor::zeros({4, 3});
  REQUIRE_THROWS_WITH(ops::embedding(weight, Tensor::from_ints({}, {0})),
                      Contains("embedding") && Contains("I32[0]") &&
                          Contains("empty"));
  REQUIRE_THROWS_WITH(ops::embedding(weight, Tensor::from_ints({}, {2, 0})),
                      Contains("I32[2, 0]"));
}

// ---- dropout_add -----------------------------------------------------------------------------

TEST_CASE("dropout_add is add(residual, dropout(x)) bit for bit, gradients included",
          "[nn][dropout]") {
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    for (int64_t n : {1, 7, 4097, 10001}) {
      for (double p : {0.2, 0.5}) {
        INFO(dtype << " [" << n << "] p " << p);
        const Tensor r0 = random_tensor({n}, 20, -2.f, 2.f, dtype);
        const Tensor x0 = random_tensor({n}, 21, -2.f, 2.f, dtype);
        const Tensor upstream = random_tensor({n}, 22, -1.f, 1.f, dtype);
        Tensor r_composed = r0.clone().set_requires_grad(true);
        Tensor x_composed = x0.clone().set_requires_grad(true);
        Tensor r_fused = r0.clone().set_requires_grad(true);
        Tensor x_fused = x0.clone().set_requires_grad(true);
        Generator gen_composed(23), gen_fused(23);
        const Tensor composed =
            ops::add(r_composed, ops::dropout(x_composed, p, true, gen_composed));
        const Tensor fused = ops::dropout_add(r_fused, x_fused, p, true, gen_fused);
        CHECK(raw_bytes(fused) == raw_bytes(composed));
        CHECK(gen_fused.offset() == gen_composed.offset());
        composed.backward(upstream);
        fused.backward(upstream);
        CHECK(raw_bytes(r_fused.grad()) == raw_bytes(r_composed.grad()));
        CHECK(raw_bytes(x_fused.grad()) == raw_bytes(x_composed.grad()));
      }
    }
  }
}

TEST_CASE("dropout_add may write over its residual or its input", "[nn][dropout]") {
  Backend& cpu = backend_for(kCPU);
  const Tensor r = random_tensor({999}, 24, -2.f, 2.f, DType::F16);
  const Tensor x = random_tensor({999}, 25, -2.f, 2.f, DType::F16);
  const PhiloxKey key{26, 0};
  Tensor expected = Tensor::empty({999}, DType::F16);
  cpu.dropout_add(r, x, 0.3f, key, expected);
  Tensor over_residual = r.clone(), over_input = x.clone();
  cpu.dropout_add(over_residual, x, 0.3f, key, over_residual);
  cpu.dropout_add(r, over_input, 0.3f, key, over_input);
  CHECK(raw_bytes(over_residual) == raw_bytes(expected));
  CHECK(raw_bytes(over_input) == raw_bytes(expected));
}

TEST_CASE("dropout_add is a plain add without a mask to draw, and refuses bad input",
          "[nn][dropout]") {
  const Tensor r = random_tensor({3, 4}, 27);
  const Tensor x = random_tensor({3, 4}, 28);
  Generator gen(29);
  for (const Tensor& y : {ops::dropout_add(r, x, 0.5, false, gen), ops::dropout_add(r, x, 0.0, true, gen)})
    CHECK(raw_bytes(y) == raw_bytes(ops::add(r, x)));
  CHECK(gen.offset() == 0);  // no counters taken
  REQUIRE_THROWS_WITH(ops::dropout_add(r, random_tensor({4, 3}, 30), 0.5, true, gen),
                      Contains("dropout_add") && Contains("one shape"));
  REQUIRE_THROWS_WITH(ops::dropout_add(r, x.to(DType::F16), 0.5, true, gen),
                      Contains("dropout_add"));
  REQUIRE_THROWS_WITH(ops::dropout_add(r, x, 1.0, true, gen),
                      Contains("dropout_add") && Contains("p must be"));
  REQUIRE_THROWS_WITH(ops::dropout_add(Tensor::from_ints({1, 2}, {2}), Tensor::from_ints({1, 2}, {2}), 0.5, true, gen),
                      Contains("dropout_add") && Contains("I32[2]"));
  Tensor y = Tensor::empty({3, 4});
  REQUIRE_THROWS_WITH(backend_for(kCPU).dropout_add(r, random_tensor({12}, 31), 0.5f, {1, 0}, y),
                      Contains("dropout_add"));
  CHECK(gen.offset() == 0);
}

}  // namespace
}  // namespace mixprec
