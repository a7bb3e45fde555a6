// transpose, permute, concat, split and slice, and the backend's permute and copy_narrow:
// values against index-by-index references (they move data, so results must be exact in
// every dtype), the gradients of uses the op table does not draw, and input validation. Each
// op's own gradients and its exact F16/BF16 results are the op table's (tests/ops/).
#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "core/autograd/grad_mode.h"
#include "core/backend.h"
#include "gradcheck.h"

namespace mixprec {
namespace {

using namespace testing;

int64_t flat_of(const std::vector<int64_t>& c, const Shape& shape) {
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + c[d];
  return flat;
}

// y = x permuted by perm (y.shape[i] == x.shape[perm[i]]), element by element.
std::vector<float> reference_permute(const std::vector<float>& x, const Shape& sx,
                                     const std::vector<int64_t>& perm) {
  Shape sy(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) sy[i] = sx[perm[i]];
  std::vector<float> y(x.size());
  for (size_t k = 0; k < y.size(); ++k) {
    const std::vector<int64_t> cy = coords_of(static_cast<int64_t>(k), sy);
    std::vector<int64_t> cx(perm.size());
    for (size_t i = 0; i < perm.size(); ++i) cx[perm[i]] = cy[i];
    y[k] = x[flat_of(cx, sx)];
  }
  return y;
}

// A tensor whose values are its own flat indices: every misplaced element is visible.
Tensor iota(const Shape& shape, DType dtype = DType::F32) {
  std::vector<float> v(shape_numel(shape));
  std::iota(v.begin(), v.end(), 0.f);
  return Tensor::from_vector(v, shape, dtype);
}

// ---- permute / transpose -------------------------------------------------------------------

TEST_CASE("permute matches an index reference for every permutation", "[elementwise]") {
  const Shape shape{2, 3, 4, 5};
  const Tensor x = iota(shape);
  std::vector<int64_t> perm{0, 1, 2, 3};
  int count = 0;
  do {
    const Tensor y = ops::permute(x, perm);
    CHECK(y.to_float_vector() == reference_permute(x.to_float_vector(), shape, perm));
    ++count;
  } while (std::next_permutation(perm.begin(), perm.end()));
  CHECK(count == 24);
  // Negative entries count from the end.
  CHECK(ops::permute(x, {-1, 0, 1, 2}).shape() == Shape{5, 2, 3, 4});
}

TEST_CASE("permute and transpose: large, strided, extent-1 and every dtype, exactly",
          "[elementwise]") {
  struct Case {
    Shape shape;
    std::vector<int64_t> perm;
  };
  const std::vector<Case> cases = {
      {{67, 45}, {1, 0}},               // tiled 2-D transpose with partial tiles
      {{3, 67, 45}, {0, 2, 1}},         // batched transpose
      {{4, 33, 6, 16}, {0, 2, 1, 3}},   // attention head split: inner rows stay contiguous
      {{300, 257}, {1, 0}},             // parallel tiled transpose
      {{2, 1, 3, 1}, {3, 2, 1, 0}},     // extent-1 dims
      {{5}, {0}},                       // identity
      {{7, 1, 9}, {1, 0, 2}},           // moving an extent-1 dim is a copy
  };
  for (const Case& c : cases) {
    for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
      const Tensor x = random_tensor(c.shape, 7, -3.f, 3.f, dtype);
      const Tensor y = ops::permute(x, c.perm);
      REQUIRE(y.dtype() == dtype);
      INFO(shape_str(c.shape) << " by " << shape_str(c.perm) << " in " << dtype);
      CHECK(y.to_float_vector() == reference_permute(x.to_float_vector(), c.shape, c.perm));
    }
  }
  // I32 (token ids) moves too.
  const Tensor ids = Tensor::from_ints({0, 1, 2, 3, 4, 5}, {2, 3});
  CHECK(ops::transpose(ids, 0, 1).to_int_vector() == std::vector<int32_t>{0, 3, 1, 4, 2, 5});
  const Tensor x = iota({2, 3, 4});
  CHECK(ops::transpose(x, -1, 0).to_float_vector() ==
        reference_permute(x.to_float_vector(), {2, 3, 4}, {2, 1, 0}));
  CHECK(ops::transpose(x, 1, 1).to_float_vector() == x.to_float_vector());
}

TEST_CASE("permute and transpose reject bad input", "[elementwise]") {
  const Tensor x = Tensor::ones({2, 3, 4});
  REQUIRE_THROWS_WITH(ops::permute(x, {0, 1}),
                      Catch::Contains("permute") && Catch::Contains("F32[2, 3, 4]") &&
                          Catch::Contains("[0, 1]"));
  REQUIRE_THROWS_WITH(ops::permute(x, {0, 1, -3}),
                      Catch::Contains("permute") && Catch::Contains("more than once"));
  REQUIRE_THROWS_WITH(ops::permute(x, {0, 1, 3}),
                      Catch::Contains("permute") && Catch::Contains("out of range"));
  REQUIRE_THROWS_WITH(ops::transpose(x, 0, 3),
                      Catch::Contains("transpose") && Catch::Contains("out of range") &&
                          Catch::Contains("F32[2, 3, 4]"));
  REQUIRE_THROWS_WITH(ops::transpose(Tensor(), 0, 1), Catch::Contains("transpose") && Catch::Contains("undefined"));
  REQUIRE_THROWS_WITH(ops::transpose(Tensor::empty({0, 2}), 0, 1),
                      Catch::Contains("transpose") && Catch::Contains("empty"));
}

// ---- concat / split / slice ------------------------------------------------------------------

// Element k of concat(xs, dim): found by walking the pieces along `dim`.
std::vector<float> reference_concat(const std::vector<Tensor>& xs, int64_t dim) {
  Shape out = xs[0].shape();
  out[dim] = 0;
  for (const Tensor& x : xs) out[dim] += x.shape()[dim];
  std::vector<float> y(shape_numel(out));
  for (size_t k = 0; k < y.size(); ++k) {
    std::vector<int64_t> c = coords_of(static_cast<int64_t>(k), out);
    for (const Tensor& x : xs) {
      if (c[dim] < x.shape()[dim]) {
        y[k] = static_cast<float>(x.get(flat_of(c, x.shape())));
        break;
      }
      c[dim] -= x.shape()[dim];
    }
  }
  return y;
}

TEST_CASE("concat matches an index reference along every dim", "[elementwise]") {
  for (int64_t dim : {0, 1, 2, -1}) {
    const int64_t d = dim < 0 ? dim + 3 : dim;
    std::vector<Tensor> xs;
    for (int64_t len : {2, 1, 3}) {
      Shape s{2, 3, 4};
      s[d] = len;
      xs.push_back(random_tensor(s, 20 + len, -1.f, 1.f));
    }
    const Tensor y = ops::concat(xs, dim);
    Shape expect{2, 3, 4};
    expect[d] = 6;
    CHECK(y.shape() == expect);
    CHECK(y.to_float_vector() == reference_concat(xs, d));
  }
  const Tensor a = Tensor::from_ints({1, 2}, {1, 2}), b = Tensor::from_ints({3, 4, 5, 6}, {2, 2});
  CHECK(ops::concat({a, b}, 0).to_int_vector() == std::vector<int32_t>{1, 2, 3, 4, 5, 6});
  // Large, for the parallel row copies.
  const Tensor big0 = random_tensor({300, 100}, 1), big1 = random_tensor({300, 157}, 2);
  CHECK(ops::concat({big0, big1}, 1).to_float_vector() == reference_concat({big0, big1}, 1));
}

TEST_CASE("split and slice match index references", "[elementwise]") {
  const Tensor x = iota({4, 6, 3});
  const std::vector<Tensor> pieces = ops::split(x, {1, 3, 2}, 1);
  REQUIRE(pieces.size() == 3);
  CHECK(pieces[0].shape() == Shape{4, 1, 3});
  CHECK(pieces[1].shape() == Shape{4, 3, 3});
  CHECK(pieces[2].shape() == Shape{4, 2, 3});
  CHECK(ops::concat(pieces, 1).to_float_vector() == x.to_float_vector());
  for (int64_t k = 0; k < pieces[1].numel(); ++k) {
    std::vector<int64_t> c = coords_of(k, pieces[1].shape());
    c[1] += 1;
    CHECK(pieces[1].get(k) == x.get(flat_of(c, x.shape())));
  }
  const Tensor s = ops::slice(x, 1, 2, 5);
  CHECK(s.shape() == Shape{4, 3, 3});
  CHECK(s.to_float_vector() == ops::split(x, {2, 3, 1}, 1)[1].to_float_vector());
  // Negative bounds count from the end; end is exclusive.
  CHECK(ops::slice(x, -1, -2, 3).to_float_vector() == ops::slice(x, 2, 1, 3).to_float_vector());
  CHECK(ops::slice(x, 0, 0, 4).to_float_vector() == x.to_float_vector());
  // Token ids shifted by one: the language-model targets.
  const Tensor ids = Tensor::from_ints({5, 6, 7, 8, 9, 10}, {2, 3});
  CHECK(ops::slice(ids, 1, 1, 3).to_int_vector() == std::vector<int32_t>{6, 7, 9, 10});
}

// The op table checks each op's gradients and F16/BF16 results alone; these are the uses it
// does not draw: a tensor concatenated twice, a piece left unused, a slice of a slice.
TEST_CASE("concat, split and slice gradients: repeated inputs, unused pieces, nested slices",
          "[elementwise]") {
  Tensor a = random_tensor({2, 3}, 31).set_requires_grad(true);
  // The same tensor twice, mixed with one that needs no gradient.
  const Tensor fixed = random_tensor({2, 5}, 34);
  gradcheck("concat repeated", [&fixed](const std::vector<Tensor>& in) {
    return ops::concat({in[0], fixed, in[0]}, 1);
  }, {a});
  CHECK(!fixed.grad().defined());

  Tensor x = random_tensor({3, 7, 2}, 35).set_requires_grad(true);
  // Pieces used out of order and one unused: its gradient is zero.
  gradcheck("split", [](const std::vector<Tensor>& in) {
    const std::vector<Tensor> p = ops::split(in[0], {2, 3, 2}, 1);
    return ops::mul(p[2], p[0]);
  }, {x});
  gradcheck("slice of slice", [](const std::vector<Tensor>& in) {
    return ops::slice(ops::slice(in[0], 0, 1, 3), 2, 1, 2);
  }, {x});
}

TEST_CASE("concat, split and slice reject bad input", "[elementwise]") {
  const Tensor x = Tensor::ones({2, 3});
  REQUIRE_THROWS_WITH(ops::concat({}, 0), Catch::Contains("concat") && Catch::Contains("no tensors"));
  REQUIRE_THROWS_WITH(ops::concat({x, Tensor::ones({3, 3})}, 1),
                      Catch::Contains("concat") && Catch::Contains("F32[3, 3]") &&
                          Catch::Contains("F32[2, 3]"));
  REQUIRE_THROWS_WITH(ops::concat({x, Tensor::ones({2, 3}, DType::F16)}, 0),
                      Catch::Contains("concat") && Catch::Contains("F16[2, 3]"));
  REQUIRE_THROWS_WITH(ops::concat({x, Tensor::ones({2, 3, 1})}, 0),
                      Catch::Contains("concat") && Catch::Contains("[2, 3, 1]"));
  REQUIRE_THROWS_WITH(ops::concat({x, x}, 2), Catch::Contains("concat") && Catch::Contains("out of range"));
  REQUIRE_THROWS_WITH(ops::concat({x, Tensor()}, 0),
                      Catch::Contains("concat") && Catch::Contains("tensor 1") &&
                          Catch::Contains("undefined"));
  REQUIRE_THROWS_WITH(ops::split(x, {1, 1}, 1),
                      Catch::Contains("split") && Catch::Contains("sum to 2") &&
                          Catch::Contains("F32[2, 3]"));
  REQUIRE_THROWS_WITH(ops::split(x, {3, 0}, 1),
                      Catch::Contains("split") && Catch::Contains("positive"));
  REQUIRE_THROWS_WITH(ops::split(x, {}, 1), Catch::Contains("split") && Catch::Contains("no sizes"));
  REQUIRE_THROWS_WITH(ops::slice(x, 1, 2, 5),
                      Catch::Contains("slice") && Catch::Contains("[2, 5)") &&
                          Catch::Contains("F32[2, 3]"));
  REQUIRE_THROWS_WITH(ops::slice(x, 1, 2, 2), Catch::Contains("slice") && Catch::Contains("empty"));
  REQUIRE_THROWS_WITH(ops::slice(x, 1, -4, 2), Catch::Contains("slice") && Catch::Contains("out of bounds"));
  REQUIRE_THROWS_WITH(ops::slice(x, 2, 0, 1), Catch::Contains("slice") && Catch::Contains("out of range") &&
                                                  Catch::Contains("F32[2, 3]"));
}

// ---- backend copy_narrow ----------------------------------------------------------------------

TEST_CASE("backend copy_narrow copies a window and keeps the rest of dst", "[elementwise]") {
  Backend& be = backend_for(kCPU);
  const Tensor src = iota({2, 5, 3});
  Tensor dst = Tensor::full({2, 4, 3}, 100.0);
  be.copy_narrow(src, 1, 1, dst, 2, 2);
  be.copy_narrow(src, 1, 4, dst, 0, 1);
  const std::vector<float> d = dst.to_float_vector();
  for (int64_t k = 0; k < dst.numel(); ++k) {
    const std::vector<int64_t> c = coords_of(k, {2, 4, 3});
    const auto src_at = [&](int64_t j) { return static_cast<float>(c[0] * 15 + j * 3 + c[2]); };
    const float expect = c[1] == 0 ? src_at(4) : (c[1] == 1 ? 100.f : src_at(c[1] - 1));
    INFO("element " << k);
    CHECK(d[k] == expect);
  }
  // 16-bit elements move as raw words: a subnormal arrives unchanged.
  Tensor h = Tensor::full({1, 3}, 1.0, DType::F16);
  be.copy_narrow(Tensor::full({1, 2}, 0x1p-24, DType::F16), 1, 0, h, 1, 2);
  CHECK(h.get(0) == 1.0);
  CHECK(h.get(1) == 0x1p-24);
  CHECK(h.get(2) == 0x1p-24);
  Tensor small = Tensor::empty({2, 2, 3});
  REQUIRE_THROWS_WITH(be.copy_narrow(src, 1, 4, small, 0, 2),
                      Catch::Contains("copy_narrow") && Catch::Contains("out of bounds"));
  Tensor other = Tensor::empty({3, 2, 3});
  REQUIRE_THROWS_WITH(be.copy_narrow(src, 1, 0, other, 0, 2),
                      Catch::Contains("copy_narrow") && Catch::Contains("[3, 2, 3]"));
}

}  // namespace
}  // namespace mixprec
