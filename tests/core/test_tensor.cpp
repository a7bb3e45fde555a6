// Tensor, Storage, factories, conversions and printing.
#include <catch2/catch.hpp>

#include <cmath>
#include <type_traits>

#include "core/backend.h"
#include "core/generator.h"
#include "core/ops/ops.h"
#include "core/tensor.h"

using namespace mixprec;

TEST_CASE("storage is move-only and releases on move", "[tensor]") {
  STATIC_REQUIRE(!std::is_copy_constructible_v<Storage>);
  STATIC_REQUIRE(!std::is_copy_assignable_v<Storage>);
  STATIC_REQUIRE(std::is_nothrow_move_constructible_v<Storage>);
  Storage a(64, kCPU);
  void* p = a.data();
  REQUIRE(p != nullptr);
  Storage b(std::move(a));
  CHECK(b.data() == p);
  CHECK(b.nbytes() == 64);
  CHECK(a.data() == nullptr);
  CHECK(a.nbytes() == 0);
  Storage empty(0, kCPU);
  CHECK(empty.data() == nullptr);
}

TEST_CASE("factories fill shape, dtype and values", "[tensor]") {
  const Tensor z = Tensor::zeros({2, 3});
  CHECK(z.shape() == Shape{2, 3});
  CHECK(z.numel() == 6);
  CHECK(z.dtype() == DType::F32);
  for (int i = 0; i < 6; ++i) CHECK(z.get(i) == 0.0);

  const Tensor o = Tensor::ones({4}, DType::F16);
  CHECK(o.nbytes() == 8);
  for (int i = 0; i < 4; ++i) CHECK(o.get(i) == 1.0);

  const Tensor f = Tensor::full({3}, 65520.0, DType::F16);  // rounds to +inf in FP16
  CHECK(std::isinf(f.get(0)));
  const Tensor b = Tensor::full({1}, 1.0 + 1.0 / 256, DType::BF16);  // tie -> even (1.0)
  CHECK(b.get(0) == 1.0);

  const Tensor r = Tensor::arange(0, 5);
  CHECK(r.shape() == Shape{5});
  CHECK(r.to_float_vector() == std::vector<float>{0, 1, 2, 3, 4});
  const Tensor ri = Tensor::arange(10, 0, -3, DType::I32);
  CHECK(ri.to_int_vector() == std::vector<int32_t>{10, 7, 4, 1});
  CHECK(Tensor::arange(3, 3).numel() == 0);

  const Tensor s = Tensor::scalar(2.5);
  CHECK(s.dim() == 0);
  CHECK(s.item() == 2.5);
}

TEST_CASE("from_vector rounds once into the target dtype", "[tensor]") {
  const Tensor h = Tensor::from_vector({1e-8f, 0.00016384f, 65504.f}, {3}, DType::F16);
  CHECK(h.get(0) == 0.0);
  CHECK(h.get(1) == 0.00016379356384277344);
  CHECK(h.get(2) == 65504.0);
  const Tensor i = Tensor::from_ints({3, -1, 7}, {3});
  CHECK(i.dtype() == DType::I32);
  CHECK(i.get(1) == -1);
  REQUIRE_THROWS_WITH(Tensor::from_vector({1.f, 2.f}, {3}),
                      Catch::Contains("2 values") && Catch::Contains("[3]"));
}

TEST_CASE("clone is deep, detach and copies of the handle share data", "[tensor]") {
  Tensor a = Tensor::from_vector({1, 2, 3}, {3});
  Tensor alias = a;
  Tensor detached = a.detach();
  Tensor deep = a.clone();
  a.set(0, 42);
  CHECK(alias.get(0) == 42);
  CHECK(detached.get(0) == 42);
  CHECK(deep.get(0) == 1);
  CHECK(alias.is_same(a));
  CHECK(!deep.is_same(a));
}

TEST_CASE("seeded generators reproduce uniform and normal draws", "[tensor]") {
  Generator g1(7), g2(7), g3(8);
  const Tensor a = Tensor::uniform({1000}, g1, -2.f, 3.f);
  const Tensor b = Tensor::uniform({1000}, g2, -2.f, 3.f);
  const Tensor c = Tensor::uniform({1000}, g3, -2.f, 3.f);
  CHECK(a.to_float_vector() == b.to_float_vector());
  CHECK(a.to_float_vector() != c.to_float_vector());
  double mean = 0;
  for (float v : a.to_float_vector()) {
    CHECK(v >= -2.f);
    CHECK(v < 3.f);
    mean += v / 1000.0;
  }
  CHECK(mean == Approx(0.5).margin(0.15));
  // The generator advances: a second draw differs from the first.
  const Tensor a2 = Tensor::uniform({1000}, g1, -2.f, 3.f);
  CHECK(a2.to_float_vector() != a.to_float_vector());
  CHECK(g1.offset() == 2000);

  Generator gn(3);
  const std::vector<float> n = Tensor::normal({20000}, gn, 1.f, 2.f).to_float_vector();
  double m = 0, v = 0;
  for (float x : n) m += x;
  m /= n.size();
  for (float x : n) v += (x - m) * (x - m);
  v /= n.size();
  CHECK(m == Approx(1.0).margin(0.05));
  CHECK(std::sqrt(v) == Approx(2.0).margin(0.05));
  // The same state gives the same values in F16 (one rounding of the same F32 draw).
  Generator gh(3);
  const Tensor nh = Tensor::normal({20000}, gh, 1.f, 2.f, DType::F16);
  CHECK(nh.get(123) == static_cast<double>(half_bits_to_float(float_to_half_bits(n[123]))));
}

TEST_CASE("to(dtype) converts and to(device) errors cleanly without CUDA", "[tensor]") {
  const Tensor a = Tensor::from_vector({1.f, 0.1f, -3.5f}, {3});
  const Tensor h = a.to(DType::F16);
  CHECK(h.dtype() == DType::F16);
  CHECK(h.get(1) == static_cast<double>(half_bits_to_float(float_to_half_bits(0.1f))));
  const Tensor back = h.to(DType::F32);
  CHECK(back.get(2) == -3.5);
  const Tensor i = a.to(DType::I32);
  CHECK(i.to_int_vector() == std::vector<int32_t>{1, 0, -3});
  CHECK(a.to(kCPU).is_same(a));
  if (!has_backend(DeviceType::CUDA))
    REQUIRE_THROWS_WITH(a.to(cuda_device(0)), Catch::Contains("no backend for device cuda:0"));
}

TEST_CASE("item, get and set check their arguments", "[tensor]") {
  Tensor a = Tensor::zeros({2, 2});
  REQUIRE_THROWS_WITH(a.item(), Catch::Contains("exactly one element") && Catch::Contains("F32[2, 2]"));
  REQUIRE_THROWS_WITH(a.get(4), Catch::Contains("out of range"));
  REQUIRE_THROWS_WITH(a.set(-1, 0), Catch::Contains("out of range"));
  REQUIRE_THROWS_WITH(a.size(2), Catch::Contains("out of range for a tensor of rank 2"));
  CHECK(a.size(-1) == 2);
  Tensor undefined;
  REQUIRE_THROWS_WITH(undefined.shape(), Catch::Contains("undefined"));
  REQUIRE_THROWS_WITH(Tensor::zeros({2, -1}), Catch::Contains("negative extent"));
  REQUIRE_THROWS_WITH(a.data_as<int32_t>(), Catch::Contains("F32") && Catch::Contains("I32"));
}

TEST_CASE("printing shows dtype, shape and values", "[tensor]") {
  const Tensor a = Tensor::from_vector({1.5f, -2.f}, {1, 2}, DType::BF16);
  const std::string s = a.to_string();
  CHECK(s.find("BF16[1, 2]") != std::string::npos);
  CHECK(s.find("1.5") != std::string::npos);
  CHECK(s.find("-2") != std::string::npos);
  const std::string long_s = Tensor::zeros({100}).to_string(4);
  CHECK(long_s.find("96 more") != std::string::npos);
}

TEST_CASE("reshape and flatten share storage and check sizes", "[tensor]") {
  Tensor a = Tensor::arange(0, 24).reshape({2, 3, 4});
  CHECK(a.shape() == Shape{2, 3, 4});
  CHECK(ops::flatten(a).shape() == Shape{24});
  const Tensor f = ops::flatten(a, 1);
  CHECK(f.shape() == Shape{2, 12});
  CHECK(ops::flatten(a, 0, 1).shape() == Shape{6, 4});
  REQUIRE_THROWS_WITH(ops::flatten(a, 2, 1), Catch::Contains("flatten") && Catch::Contains("comes after"));
  const Tensor g = a.reshape({-1, 4});
  CHECK(g.shape() == Shape{6, 4});
  a.set(5, 100);
  CHECK(g.get(5) == 100);
  REQUIRE_THROWS_WITH(a.reshape({5, 5}), Catch::Contains("reshape") && Catch::Contains("[5, 5]"));
  REQUIRE_THROWS_WITH(a.reshape({-1, -1}), Catch::Contains("only one extent may be -1"));
}

TEST_CASE("parse_dtype accepts the usual spellings", "[tensor]") {
  CHECK(parse_dtype("fp16") == DType::F16);
  CHECK(parse_dtype("BFloat16") == DType::BF16);
  CHECK(parse_dtype("float32") == DType::F32);
  REQUIRE_THROWS_WITH(parse_dtype("fp8"), Catch::Contains("unknown dtype 'fp8'"));
}

TEST_CASE("shapes whose element count overflows are rejected", "[tensor]") {
  REQUIRE_THROWS_WITH(Tensor::empty({int64_t{1} << 32, int64_t{1} << 32}),
                      Catch::Contains("too many elements"));
  REQUIRE_THROWS_WITH(Tensor::empty({2, (int64_t{1} << 62) + 1, 4}),
                      Catch::Contains("too many elements"));
  REQUIRE_THROWS_WITH(Tensor::empty({int64_t{1} << 62}), Catch::Contains("more bytes"));
  REQUIRE_THROWS_WITH(Tensor::arange(0, 1e30), Catch::Contains("arange") && Catch::Contains("too many"));
}

TEST_CASE("set_grad accepts only gradients that fit the tensor", "[tensor]") {
  Tensor x = Tensor::zeros({2});
  REQUIRE_THROWS_WITH(x.set_grad(Tensor::zeros({2}, DType::I32)),
                      Catch::Contains("set_grad") && Catch::Contains("I32[2]") && Catch::Contains("floating"));
  REQUIRE_THROWS_WITH(x.set_grad(Tensor::zeros({3})), Catch::Contains("F32[3]"));
  x.set_grad(Tensor::ones({2}));
  CHECK(x.grad().get(1) == 1.0);
}
