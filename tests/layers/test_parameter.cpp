// Parameter: the FP32 master, the working copy per working dtype, gradients and freezing.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/half.h"
#include "core/ops/ops.h"
#include "core/tensor.h"
#include "layers/parameter.h"

using namespace mixprec;

namespace {

// The bits `dtype` stores for each float of `values`.
std::vector<uint16_t> rounded_bits(const std::vector<float>& values, DType dtype) {
  std::vector<uint16_t> out;
  for (float v : values)
    out.push_back(dtype == DType::F16 ? float_to_half_bits(v) : float_to_bf16_bits(v));
  return out;
}

std::vector<uint16_t> bits_of(const Tensor& t) {
  std::vector<uint16_t> out(static_cast<size_t>(t.numel()));
  std::memcpy(out.data(), t.data(), t.nbytes());
  return out;
}

const std::vector<float> kValues = {0.1f, -2.7182817f, 1000.3f, 3.0e-6f, -0.0f, 7.f};

}  // namespace

TEST_CASE("a parameter keeps an F32 master copied from its initial value", "[parameter]") {
  Tensor init = Tensor::from_vector({1.5f, -2.25f, 0.1f}, {3}, DType::F16);
  Parameter p("fc.weight", init);
  REQUIRE(p.defined());
  CHECK(p.name() == "fc.weight");
  CHECK(p.shape() == Shape{3});
  CHECK(p.numel() == 3);
  CHECK(p.device() == kCPU);
  const Tensor m = p.master();
  CHECK(m.dtype() == DType::F32);
  CHECK(m.requires_grad());
  CHECK(m.is_leaf());
  CHECK(m.name() == "fc.weight");
  // Widening is exact: the master holds the F16 values themselves.
  CHECK(m.to_float_vector() == init.to_float_vector());

  // Under F32 the master is the working tensor.
  CHECK(p.working_dtype() == DType::F32);
  CHECK(p.working().is_same(m));

  // The master is a copy, also of an F32 value.
  Tensor f32 = Tensor::from_vector({1.f, 2.f}, {2});
  Parameter q("bias", f32);
  f32.set(0, 9.0);
  CHECK(q.master().get(0) == 1.0);

  // Copies of the handle share one parameter.
  Parameter alias = p;
  alias.set_working_dtype(DType::BF16);
  CHECK(p.working_dtype() == DType::BF16);
  CHECK(alias.is_same(p));
  CHECK(!q.is_same(p));
}

TEST_CASE("an F16 or BF16 working copy is the rounded master and gets an F32 gradient",
          "[parameter]") {
  for (DType dtype : {DType::F16, DType::BF16}) {
    CAPTURE(dtype);
    Parameter p("layer.w", Tensor::from_vector(kValues, {2, 3}));
    p.set_working_dtype(dtype);
    const Tensor w = p.working();
    CHECK(p.working_dtype() == dtype);
    CHECK(w.dtype() == dtype);
    CHECK(w.shape() == Shape{2, 3});
    CHECK(!w.is_same(p.master()));
    CHECK(w.is_leaf());
    CHECK(w.requires_grad());
    CHECK(w.name() == "layer.w");
    CHECK(p.master().name() == "layer.w");
    CHECK(bits_of(w) == rounded_bits(kValues, dtype));
    CHECK(p.master().to_float_vector() == kValues);  // the master keeps full precision

    // A forward in the working dtype: loss = sum(w * x), so dloss/dw = x.
    const std::vector<float> xv = {1.f, -2.f, 0.5f, 4.f, 0.25f, -8.f};
    Tensor x = Tensor::from_vector(xv, {2, 3}, dtype);
    Tensor loss = ops::sum(ops::mul(w, x));
    loss.backward();
    const Tensor g = p.grad();
    REQUIRE(g.defined());
    CHECK(g.dtype() == DType::F32);
    CHECK(g.is_same(w.grad()));
    CHECK(g.to_float_vector() == xv);
    CHECK(!p.master().grad().defined());
  }
}

TEST_CASE("refresh_working rewrites the working copy from the master", "[parameter]") {
  for (DType dtype : {DType::F16, DType::BF16}) {
    CAPTURE(dtype);
    Parameter p("w", Tensor::from_vector({1.f, 2.f, 3.f}, {3}));
    p.set_working_dtype(dtype);
    const Tensor w = p.working();
    Tensor x = Tensor::from_vector({1.f, 1.f, 1.f}, {3}, dtype);
    x.set_requires_grad(true);
    Tensor y = ops::sum(ops::mul(w, x));  // saves w for x's gradient

    const std::vector<float> updated = {0.3f, -1.0e-3f, 70000.f};
    p.master().copy_(Tensor::from_vector(updated, {3}));
    p.refresh_working();
    CHECK(p.working().is_same(w));  // the same leaf, rewritten in place
    CHECK(bits_of(w) == rounded_bits(updated, dtype));
    // The graph saved the old values: its backward must refuse to run.
    CHECK_THROWS_WITH(y.backward(), Catch::Contains("modified"));
  }

  // Under F32 there is nothing to refresh: the working tensor is the master.
  Parameter p("w32", Tensor::from_vector({1.f}, {1}));
  p.master().fill_(5.0);
  p.refresh_working();
  CHECK(p.working().item() == 5.0);
}

TEST_CASE("set_working_dtype drops gradients and switching back restores the master",
          "[parameter]") {
  Parameter p("w", Tensor::from_vector({1.f, 2.f}, {2}));
  ops::sum(ops::mul(p.working(), p.working())).backward();
  REQUIRE(p.grad().defined());
  const Tensor old_working = p.working();

  p.set_working_dtype(DType::F16);
  CHECK(!p.grad().defined());
  CHECK(!old_working.grad().defined());
  CHECK(!p.master().requires_grad());  // only the working copy is differentiated now
  ops::sum(p.working()).backward();
  REQUIRE(p.grad().defined());
  const Tensor f16_working = p.working();

  p.set_working_dtype(DType::BF16);
  CHECK(!p.grad().defined());
  CHECK(!f16_working.grad().defined());

  p.set_working_dtype(DType::F32);
  CHECK(p.working().is_same(p.master()));
  CHECK(p.master().requires_grad());
  CHECK(!p.grad().defined());
  ops::sum(p.working()).backward();
  CHECK(p.grad().to_float_vector() == std::vector<float>{1.f, 1.f});

  CHECK_THROWS_WITH(p.set_working_dtype(DType::I32), Catch::Contains("'w'"));
}

TEST_CASE("zero_grad drops the gradient or fills it with zeros", "[parameter]") {
  for (DType dtype : {DType::F32, DType::F16}) {
    CAPTURE(dtype);
    Parameter p("w", Tensor::from_vector({1.f, 2.f}, {2}));
    p.set_working_dtype(dtype);
    ops::sum(p.working()).backward();
    const Tensor g = p.grad();
    REQUIRE(g.to_float_vector() == std::vector<float>{1.f, 1.f});

    p.zero_grad(false);
    CHECK(p.grad().is_same(g));
    CHECK(g.to_float_vector() == std::vector<float>{0.f, 0.f});
    ops::sum(ops::mul_scalar(p.working(), 3.0)).backward();
    CHECK(p.grad().is_same(g));
    CHECK(g.to_float_vector() == std::vector<float>{3.f, 3.f});

    p.zero_grad();
    CHECK(!p.grad().defined());
    p.zero_grad(false);  // nothing to fill
    CHECK(!p.grad().defined());
  }
}

TEST_CASE("a frozen parameter receives no gradient", "[parameter]") {
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    CAPTURE(dtype);
    Parameter frozen("frozen", Tensor::from_vector({1.f, 2.f}, {2}));
    Parameter live("live", Tensor::from_vector({3.f, 4.f}, {2}));
    frozen.set_requires_grad(false);
    frozen.set_working_dtype(dtype);  // stays frozen across the switch
    live.set_working_dtype(dtype);
    CHECK(!frozen.requires_grad());
    CHECK(!frozen.working().requires_grad());
    CHECK(!frozen.master().requires_grad());
    ops::sum(ops::mul(frozen.working(), live.working())).backward();
    CHECK(!frozen.grad().defined());
    REQUIRE(live.grad().defined());
    CHECK(live.grad().to_float_vector() == std::vector<float>{1.f, 2.f});

    frozen.set_requires_grad(true);
    CHECK(frozen.working().requires_grad());
    ops::sum(ops::mul(frozen.working(), live.working())).backward();
    CHECK(frozen.grad().to_float_vector() == std::vector<float>{3.f, 4.f});
  }
}

TEST_CASE("a parameter rejects bad input and undefined use", "[parameter]") {
  CHECK_THROWS_WITH(Parameter("", Tensor::ones({2})), Catch::Contains("name"));
  CHECK_THROWS_WITH(Parameter("w", Tensor()),
                    Catch::Contains("'w'") && Catch::Contains("undefined"));
  CHECK_THROWS_WITH(Parameter("ids", Tensor::from_ints({1, 2}, {2})),
                    Catch::Contains("'ids'") && Catch::Contains("I32"));
  Parameter undefined;
  CHECK(!undefined.defined());
  CHECK_THROWS_WITH(undefined.name(), Catch::Contains("undefined"));
  CHECK_THROWS(undefined.master());
  CHECK_THROWS(undefined.zero_grad());
}
