// sum and mean (over everything and over dims), and the backend's sum_to on every path of
// its kernel: against a double-precision reference, finite differences, F16/BF16 against
// F32, FP32 accumulation of low-precision inputs, and input validation.
#include <cmath>
#include <string>
#include <vector>

#include "core/autograd/grad_mode.h"
#include "core/backend.h"
#include "gradcheck.h"

namespace mixprec {
namespace {

using namespace testing;

// Sum (times `scale`) of x over the dims where `kept` (same rank as x) has extent 1 while x
// does not, computed in double; the result is laid out in `kept`'s shape.
std::vector<double> reference_reduce(const Tensor& x, const Shape& kept, double scale) {
  const Shape& sx = x.shape();
  const std::vector<float> xv = x.to_float_vector();
  std::vector<double> out(shape_numel(kept), 0.0);
  for (int64_t i = 0; i < x.numel(); ++i) {
    int64_t rest = i, index = 0, stride = 1;
    for (size_t d = sx.size(); d-- > 0;) {
      const int64_t c = rest % sx[d];
      rest /= sx[d];
      index += (kept[d] == 1 ? 0 : c) * stride;
      stride *= kept[d];
    }
    out[index] += xv[i];
  }
  for (double& v : out) v *= scale;
  return out;
}

Shape kept_shape(const Shape& sx, const std::vector<int64_t>& dims) {
  Shape kept = sx;
  for (int64_t d : dims) kept[d < 0 ? d + sx.size() : d] = 1;
  return kept;
}

TEST_CASE("sum and mean over everything match a double reference", "[elementwise]") {
  for (const Shape& shape : {Shape{3, 7}, Shape{13}, Shape{1}, Shape{}, Shape{2, 3, 5, 7}}) {
    const Tensor x = random_tensor(shape, 3 + shape.size(), -2.f, 3.f);
    const Tensor s = ops::sum(x), m = ops::mean(x);
    REQUIRE(s.shape() == Shape{});
    REQUIRE(m.shape() == Shape{});
    const std::vector<double> ref = reference_reduce(x, Shape(shape.size(), 1), 1.0);
    CHECK(s.item() == Approx(ref[0]).epsilon(1e-6).margin(1e-5));
    CHECK(m.item() == Approx(ref[0] / x.numel()).epsilon(1e-6).margin(1e-6));
  }
  // Large enough for the chunked parallel path.
  const Tensor big = random_tensor({1000, 301}, 5, 0.f, 1.f);
  require_matches(ops::sum(big), reference_reduce(big, {1, 1}, 1.0), 1e-5, "sum of 301000");
  require_matches(ops::mean(big), reference_reduce(big, {1, 1}, 1.0 / big.numel()), 1e-5,
                  "mean of 301000");
}

struct DimsCase {
  Shape shape;
  std::vector<int64_t> dims;
};

const std::vector<DimsCase>& dims_cases() {
  static const std::vector<DimsCase> cases = {
      {{3, 4, 5}, {0}},       {{3, 4, 5}, {1}},        {{3, 4, 5}, {2}},
      {{3, 4, 5}, {-1}},      {{3, 4, 5}, {0, 2}},     {{3, 4, 5}, {2, 0}},
      {{3, 4, 5}, {0, 1, 2}}, {{3, 4, 5}, {1, -1}},    {{2, 3, 1, 7}, {1, 3}},
      {{13}, {0}},            {{7, 1}, {1}},           {{1, 7}, {0}},
  };
  return cases;
}

TEST_CASE("sum and mean over dims match a double reference, with and without keepdim",
          "[elementwise]") {
  for (const DimsCase& c : dims_cases()) {
    const Tensor x = random_tensor(c.shape, 11, -2.f, 2.f);
    const Shape kept = kept_shape(c.shape, c.dims);
    int64_t count = 1;
    for (size_t d = 0; d < c.shape.size(); ++d) count *= kept[d] == c.shape[d] ? 1 : c.shape[d];
    Shape squeezed;
    for (size_t d = 0; d < c.shape.size(); ++d) {
      bool reduced = false;
      for (int64_t r : c.dims) reduced = reduced || (r < 0 ? r + (int64_t)c.shape.size() : r) == (int64_t)d;
      if (!reduced) squeezed.push_back(c.shape[d]);
    }
    const std::string label = shape_str(c.shape) + " over " + shape_str(c.dims);
    for (bool keepdim : {false, true}) {
      const Tensor s = ops::sum(x, c.dims, keepdim), m = ops::mean(x, c.dims, keepdim);
      CHECK(s.shape() == (keepdim ? kept : squeezed));
      CHECK(m.shape() == (keepdim ? kept : squeezed));
      require_matches(s, reference_reduce(x, kept, 1.0), 1e-6, "sum " + label);
      require_matches(m, reference_reduce(x, kept, 1.0 / count), 1e-6, "mean " + label);
    }
  }
}

TEST_CASE("sum and mean in F16 and BF16 accumulate in FP32 and backpropagate in their dtype",
          "[elementwise]") {
  const Tensor x = random_tensor({6, 5, 9}, 31, -1.f, 1.f);
  for (DType dtype : {DType::F16, DType::BF16}) {
    check_low_precision("sum dims", [](const std::vector<Tensor>& in) { return ops::sum(in[0], {0, 2}); },
                        {x}, dtype, 10.0);
    check_low_precision("mean dims", [](const std::vector<Tensor>& in) { return ops::mean(in[0], {1}); },
                        {x}, dtype);
    check_low_precision("mean", [](const std::vector<Tensor>& in) { return ops::mean(in[0]); }, {x},
                        dtype);

    Tensor xl = x.to(dtype);
    xl.set_requires_grad(true);
    Tensor y = ops::mean(xl, {1, 2}, true);
    REQUIRE(y.dtype() == dtype);
    y.backward(Tensor::ones(y.shape(), dtype));
    REQUIRE(xl.grad().dtype() == dtype);
    // d mean / dx = 1/45, rounded once.
    const float expect = Tensor::scalar(1.0 / 45, dtype).item();
    for (float g : xl.grad().to_float_vector()) CHECK(g == expect);
  }
  // 4096 copies of 0.1 in F16: an F16 running sum would stall near 256 (where 0.1 is below
  // half an ulp); FP32 accumulation gives 409.6 rounded once.
  const Tensor tenths = Tensor::full({4096}, 0.1, DType::F16);
  const double exact = 4096 * static_cast<double>(Tensor::scalar(0.1, DType::F16).item());
  CHECK(ops::sum(tenths).item() == Approx(exact).epsilon(1e-3));
  CHECK(ops::sum(tenths.reshape({64, 64}), {0}).to_float_vector()[0] ==
        Approx(64 * Tensor::scalar(0.1, DType::F16).item()).epsilon(1e-3));
  const Tensor column = Tensor::full({4096, 2}, 0.1, DType::BF16);
  CHECK(ops::sum(column, {0}).to_float_vector()[1] ==
        Approx(4096 * Tensor::scalar(0.1, DType::BF16).item()).epsilon(low_precision_rtol(DType::BF16)));
}

TEST_CASE("sum and mean reject bad input with the op's name", "[elementwise]") {
  const Tensor x = Tensor::ones({2, 3});
  REQUIRE_THROWS_WITH(ops::sum(x, {1, -1}),
                      Catch::Contains("sum") && Catch::Contains("more than once") &&
                          Catch::Contains("F32[2, 3]"));
  REQUIRE_THROWS_WITH(ops::mean(x, {2}), Catch::Contains("mean") && Catch::Contains("out of range") &&
                                             Catch::Contains("F32[2, 3]"));
  REQUIRE_THROWS_WITH(ops::sum(x, {-3}), Catch::Contains("sum") && Catch::Contains("-3"));
  REQUIRE_THROWS_WITH(ops::sum(x, {}), Catch::Contains("sum") && Catch::Contains("no dimensions"));
  REQUIRE_THROWS_WITH(ops::mean(Tensor::from_ints({1, 2}, {2})),
                      Catch::Contains("mean") && Catch::Contains("I32[2]"));
  REQUIRE_THROWS_WITH(ops::sum(Tensor()), Catch::Contains("sum") && Catch::Contains("undefined"));
  REQUIRE_THROWS_WITH(ops::sum(Tensor::empty({3, 0})),
                      Catch::Contains("sum") && Catch::Contains("[3, 0]") && Catch::Contains("empty"));
}

// ---- backend sum_to -------------------------------------------------------------------------

TEST_CASE("backend sum_to covers every reduction pattern", "[elementwise]") {
  Backend& be = backend_for(kCPU);
  struct Case {
    Shape x, y;
  };
  const std::vector<Case> cases = {
      {{5, 7}, {7}},                // leading rows reduced, innermost kept
      {{5, 7}, {5, 1}},             // innermost reduced
      {{5, 7}, {1, 1}},             // everything
      {{5, 7}, {5, 7}},             // nothing
      {{2, 3, 4, 5}, {3, 1, 1}},    // kept dim between reduced ones
      {{2, 3, 4, 5}, {3, 1, 5}},    // alternating
      {{2, 3, 4, 5}, {2, 1, 4, 1}}, // alternating, innermost reduced
      {{2, 1, 4, 5}, {1, 4, 1}},    // extent-1 dims in x
      {{300, 1000}, {1000}},        // several column blocks, parallel
      {{97, 301}, {301}},           // a partial column block
      {{1000, 301}, {1000, 1}},     // parallel rows, innermost reduced
      {{40, 50, 60}, {50, 1}},      // reduced on both sides of a kept dim, parallel
      {{3, 30000}, {3, 1}},         // few long rows
      {{70000, 3}, {3}},            // many short rows
  };
  for (const Case& c : cases) {
    for (DType dtype : {DType::F32, DType::BF16}) {
      const Tensor x = random_tensor(c.x, 41, -1.f, 1.f, dtype);
      Tensor y = Tensor::empty(c.y, dtype);
      be.sum_to(x, y, 0.5f);
      // Reference laid out in x's rank: pad y's shape with leading 1s.
      Shape kept(c.x.size() - c.y.size(), 1);
      kept.insert(kept.end(), c.y.begin(), c.y.end());
      const double tol = dtype == DType::F32 ? 1e-5 : low_precision_rtol(dtype);
      require_matches(y, reference_reduce(x, kept, 0.5), tol,
                      "sum_to " + shape_str(c.x) + " -> " + shape_str(c.y) + " " +
                          std::string(dtype_name(dtype)));
    }
  }
  Tensor wrong = Tensor::empty({3});
  REQUIRE_THROWS_WITH(be.sum_to(Tensor::ones({2, 5}), wrong, 1.f),
                      Catch::Contains("sum_to") && Catch::Contains("[3]") &&
                          Catch::Contains("[2, 5]"));
}

}  // namespace
}  // namespace mixprec
