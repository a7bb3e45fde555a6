// ops::split_heads and Backend::split_heads / merge_heads on the CPU: the heads of a fused
// q/k/v projection bit for bit as split, reshape and permute give them, the gradient as the
// composition's (an unused head's gradient included), and the errors of bad shapes.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/backend.h"
#include "core/error.h"
#include "core/ops/ops.h"
#include "core/tensor.h"

namespace mixprec {
namespace {

// The heads the composition makes: split into three along the last dim, each viewed as
// [B, T, H, D] and permuted to [B, H, T, D].
std::vector<Tensor> composed_heads(const Tensor& qkv, int64_t heads) {
  const int64_t b = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3, d = c / heads;
  std::vector<Tensor> out;
  for (const Tensor& part : ops::split(qkv, {c, c, c}, 2))
    out.push_back(ops::permute(ops::reshape(part, {b, t, heads, d}), {0, 2, 1, 3}));
  return out;
}

// Distinct values at every position, so a misplaced element shows.
Tensor counting(const Shape& shape, DType dtype) {
  const size_t n = static_cast<size_t>(shape_numel(shape));
  if (dtype == DType::I32) {
    std::vector<int32_t> values(n);
    std::iota(values.begin(), values.end(), 1);
    return Tensor::from_ints(values, shape);
  }
  std::vector<float> values(n);
  std::iota(values.begin(), values.end(), 1.0f);
  return Tensor::from_vector(values, shape, dtype);
}

void require_same_bytes(const Tensor& expected, const Tensor& actual) {
  REQUIRE(expected.dtype() == actual.dtype());
  REQUIRE(expected.shape() == actual.shape());
  CHECK(std::memcmp(expected.data(), actual.data(), expected.nbytes()) == 0);
}

struct HeadsCase {
  int64_t batch, time, heads, dim;
};
const HeadsCase kCases[] = {{1, 1, 1, 1}, {2, 3, 2, 5}, {2, 4, 3, 8}, {3, 2, 4, 2}};

TEST_CASE("split_heads gives the heads of split, reshape and permute bit for bit",
          "[core][attention]") {
  for (const HeadsCase& c : kCases) {
    for (DType dtype : {DType::F32, DType::F16, DType::BF16, DType::I32}) {
      INFO("B " << c.batch << " T " << c.time << " H " << c.heads << " D " << c.dim << " "
                << dtype);
      const Tensor qkv = counting({c.batch, c.time, 3 * c.heads * c.dim}, dtype);
      const std::vector<Tensor> expected = composed_heads(qkv, c.heads);
      const std::vector<Tensor> heads = ops::split_heads(qkv, c.heads);
      REQUIRE(heads.size() == 3);
      for (int i = 0; i < 3; ++i) require_same_bytes(expected[i], heads[i]);

      // merge_heads puts them back where they came from.
      Tensor merged = Tensor::zeros(qkv.shape(), dtype);
      backend_for(kCPU).merge_heads(heads[0], heads[1], heads[2], merged);
      require_same_bytes(qkv, merged);
    }
  }
}

TEST_CASE("split_heads' gradient is the composition's, an unused head's included",
          "[core][attention]") {
  const HeadsCase c{2, 3, 2, 4};
  const Shape shape{c.batch, c.time, 3 * c.heads * c.dim};
  const Tensor weights = counting({c.batch, c.heads, c.time, c.dim}, DType::F32);
  // k is left unused: its gradient is zero, and its block of qkv's gradient too.
  auto loss_of = [&](const std::vector<Tensor>& heads) {
    return ops::add(ops::sum(ops::mul(heads[0], weights)),
                    ops::sum(ops::mul(heads[2], ops::mul_scalar(weights, -0.5))));
  };
  Tensor fused = counting(shape, DType::F32);
  fused.set_requires_grad(true);
  loss_of(ops::split_heads(fused, c.heads)).backward();
  Tensor composed = counting(shape, DType::F32);
  composed.set_requires_grad(true);
  loss_of(composed_heads(composed, c.heads)).backward();
  REQUIRE(fused.grad().defined());
  require_same_bytes(composed.grad(), fused.grad());
  // The k block of every row got no gradient.
  const std::vector<float> g = fused.grad().to_float_vector();
  const int64_t width = 3 * c.heads * c.dim, block = c.heads * c.dim;
  for (int64_t row = 0; row < c.batch * c.time; ++row)
    for (int64_t j = block; j < 2 * block; ++j) {
      CHECK(g[static_cast<size_t>(row * width + j)] == 0.0f);
    }
}

TEST_CASE("split_heads rejects shapes that are not a fused q/k/v projection",
          "[core][attention]") {
  const Tensor qkv = Tensor::zeros({2, 3, 12});
  CHECK_THROWS_WITH(ops::split_heads(qkv, 5), Catch::Contains("3 * n_head * D"));
  CHECK_THROWS_WITH(ops::split_heads(qkv, 0), Catch::Contains("n_head >= 1"));
  CHECK_THROWS_WITH(ops::split_heads(Tensor::zeros({6, 12}), 2), Catch::Contains("[B, T"));
  CHECK_THROWS_AS(ops::split_heads(Tensor(), 2), Error);

  Tensor q = Tensor::empty({2, 2, 3, 2}), k = Tensor::empty({2, 2, 3, 2});
  Tensor short_v = Tensor::empty({2, 2, 3, 1});
  CHECK_THROWS_WITH(backend_for(kCPU).split_heads(qkv, q, k, short_v),
                    Catch::Contains("one shape [B, H, T, D]"));
  Tensor v = Tensor::empty({2, 2, 3, 2});
  const Tensor wrong_width = Tensor::zeros({2, 3, 9});
  CHECK_THROWS_WITH(backend_for(kCPU).split_heads(wrong_width, q, k, v),
                    Catch::Contains("[B, T, 3 * H * D]"));
  Tensor half_v = Tensor::empty({2, 2, 3, 2}, DType::F16);
  Tensor merged = Tensor::zeros({2, 3, 12});
  CHECK_THROWS_WITH(backend_for(kCPU).merge_heads(q, k, half_v, merged), Catch::Contains("F16"));
}

}  // namespace
}  // namespace mixprec
