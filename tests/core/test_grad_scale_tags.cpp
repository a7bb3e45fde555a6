// Loss-scale tags: a backward from a loss carrying loss_scale() S tags the leaf gradients it
// writes with grad_scale() S, and refuses to mix gradients of different scales in one .grad.
#include <catch2/catch.hpp>
#include <vector>

#include "core/ops/ops.h"
#include "core/tensor.h"

using namespace mixprec;

namespace {

Tensor named_leaf(const std::vector<float>& values, const char* name) {
  Tensor t = Tensor::from_vector(values, {static_cast<int64_t>(values.size())});
  t.set_requires_grad(true);
  t.set_name(name);
  return t;
}

// S * sum(a * b), tagged with S.
Tensor scaled_dot(const Tensor& a, const Tensor& b, double scale) {
  Tensor loss = ops::mul_scalar(ops::sum(ops::mul(a, b)), scale);
  loss.set_loss_scale(scale);
  return loss;
}

}  // namespace

TEST_CASE("a backward from a scaled loss tags leaf gradients with the scale",
          "[grad_scale_tags]") {
  Tensor a = named_leaf({1.f, 2.f}, "a"), b = named_leaf({3.f, -4.f}, "b");
  CHECK(a.grad_scale() == 1.0);

  scaled_dot(a, b, 1024.0).backward();
  CHECK(a.grad_scale() == 1024.0);
  CHECK(b.grad_scale() == 1024.0);
  CHECK(a.grad().to_float_vector() == std::vector<float>{3072.f, -4096.f});
  CHECK(b.grad().to_float_vector() == std::vector<float>{1024.f, 2048.f});

  // The same scale again accumulates and keeps the tag.
  scaled_dot(a, b, 1024.0).backward();
  CHECK(a.grad_scale() == 1024.0);
  CHECK(a.grad().to_float_vector() == std::vector<float>{6144.f, -8192.f});
  CHECK(b.grad().to_float_vector() == std::vector<float>{2048.f, 4096.f});

  // An unscaled loss tags fresh gradients with 1.
  Tensor c = named_leaf({5.f}, "c");
  ops::sum(ops::mul(c, c)).backward();
  CHECK(c.grad_scale() == 1.0);
  CHECK(c.grad().item() == 10.0);
}

TEST_CASE("a backward with another scale into an existing gradient throws before writing any",
          "[grad_scale_tags]") {
  Tensor a = named_leaf({1.f, 2.f}, "encoder.weight"), b = named_leaf({3.f, 4.f}, "b"),
         c = named_leaf({-1.f, 0.5f}, "c");
  scaled_dot(a, c, 256.0).backward();  // a, c tagged 256
  scaled_dot(b, b, 128.0).backward();  // b tagged 128
  const std::vector<float> ga = a.grad().to_float_vector(), gb = b.grad().to_float_vector(),
                           gc = c.grad().to_float_vector();

  // b's tag matches this backward, a's and c's do not: nothing may be written, not even b's.
  Tensor loss = ops::mul_scalar(ops::sum(ops::add(ops::mul(a, b), ops::mul(b, c))), 128.0);
  loss.set_loss_scale(128.0);
  CHECK_THROWS_WITH(loss.backward(), Catch::Contains("backward") &&
                                         (Catch::Contains("'encoder.weight'") ||
                                          Catch::Contains("'c'")) &&
                                         Catch::Contains("256") && Catch::Contains("128"));
  CHECK(a.grad().to_float_vector() == ga);
  CHECK(b.grad().to_float_vector() == gb);
  CHECK(c.grad().to_float_vector() == gc);
  CHECK(a.grad_scale() == 256.0);
  CHECK(b.grad_scale() == 128.0);
  CHECK(c.grad_scale() == 256.0);

  // With a single mismatching leaf the message names that one.
  Tensor only_a = scaled_dot(a, a, 64.0);
  CHECK_THROWS_WITH(only_a.backward(), Catch::Contains("'encoder.weight'"));
  CHECK(a.grad().to_float_vector() == ga);
}

TEST_CASE("an Overwrite backward replaces the gradient and its tag", "[grad_scale_tags]") {
  Tensor a = named_leaf({1.f, 2.f}, "a"), b = named_leaf({3.f, 4.f}, "b");
  scaled_dot(a, b, 256.0).backward();
  BackwardOptions overwrite;
  overwrite.grad_mode = GradMode::Overwrite;
  scaled_dot(a, b, 8.0).backward(Tensor(), overwrite);
  CHECK(a.grad_scale() == 8.0);
  CHECK(b.grad_scale() == 8.0);
  CHECK(a.grad().to_float_vector() == std::vector<float>{24.f, 32.f});
  CHECK(b.grad().to_float_vector() == std::vector<float>{8.f, 16.f});
}

TEST_CASE("reset_grad and set_grad return the tag to 1", "[grad_scale_tags]") {
  Tensor a = named_leaf({1.f, 2.f}, "a"), b = named_leaf({3.f, 4.f}, "b");
  const Tensor x = Tensor::from_vector({1.f, 2.f}, {2});  // not a leaf of interest
  scaled_dot(a, b, 512.0).backward();
  REQUIRE(a.grad_scale() == 512.0);
  a.reset_grad();
  CHECK(a.grad_scale() == 1.0);
  CHECK(!a.grad().defined());
  // With no gradient left, a backward of any scale writes a fresh one and tags it.
  scaled_dot(a, x, 4.0).backward();
  CHECK(a.grad_scale() == 4.0);
  CHECK(a.grad().to_float_vector() == std::vector<float>{4.f, 8.f});

  REQUIRE(b.grad_scale() == 512.0);
  b.set_grad(Tensor::from_vector({0.5f, 0.25f}, {2}));
  CHECK(b.grad_scale() == 1.0);
  // A true-scale gradient then accumulates an unscaled backward.
  ops::sum(ops::mul(b, x)).backward();
  CHECK(b.grad().to_float_vector() == std::vector<float>{1.5f, 2.25f});
  CHECK(b.grad_scale() == 1.0);

  CHECK_THROWS(a.set_grad_scale(0.0));
  CHECK_THROWS(a.set_loss_scale(-1.0));
}
