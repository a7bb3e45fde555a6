// The autograd engine: graph recording, topological backward, accumulation modes, freed
// graphs, NoGradGuard and anomaly mode.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "core/autograd/grad_mode.h"
#include "core/autograd/record.h"
#include "core/error.h"
#include "core/ops/ops.h"
#include "core/tensor.h"

using namespace mixprec;

namespace {

// y = x * x computed on the host, so the engine is tested independently of the kernels.
struct SquareBackward final : Node {
  Tensor x;
  int* calls = nullptr;
  std::string name() const override { return "test_square"; }
  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    if (calls) ++*calls;
    Tensor gx = Tensor::empty(x.shape(), x.dtype());
    for (int64_t i = 0; i < x.numel(); ++i) gx.set(i, 2 * x.get(i) * grads[0].get(i));
    return {gx};
  }
  void release_saved() override { x = Tensor(); }
};

Tensor test_square(const Tensor& x, int* calls = nullptr) {
  Tensor y = Tensor::empty(x.shape(), x.dtype());
  for (int64_t i = 0; i < x.numel(); ++i) y.set(i, x.get(i) * x.get(i));
  if (auto node = make_node<SquareBackward>({&x})) {
    node->x = save_for_backward(*node, x);
    node->calls = calls;
    attach_output(node, y);
  }
  check_forward("test_square", y);
  return y;
}

// z = a + b on the host with both gradients passed through.
struct AddBackward final : Node {
  std::string name() const override { return "test_add"; }
  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override { return {grads[0], grads[0]}; }
};

Tensor test_add(const Tensor& a, const Tensor& b) {
  Tensor z = Tensor::empty(a.shape(), a.dtype());
  for (int64_t i = 0; i < a.numel(); ++i) z.set(i, a.get(i) + b.get(i));
  if (auto node = make_node<AddBackward>({&a, &b})) attach_output(node, z);
  return z;
}

// y = x on the host; backward records the dtype of the gradient it received and returns it
// widened to F32, whatever x's dtype (as a careless op might).
struct WidenBackward final : Node {
  DType* seen = nullptr;
  std::string name() const override { return "test_widen"; }
  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    *seen = grads[0].dtype();
    return {grads[0].to(DType::F32)};
  }
};

Tensor test_widen(const Tensor& x, DType* seen) {
  Tensor y = x.detach().clone();
  if (auto node = make_node<WidenBackward>({&x})) {
    node->seen = seen;
    attach_output(node, y);
  }
  return y;
}

// y = x on the host; its backward throws, as a failing op's would.
struct FailBackward final : Node {
  std::string name() const override { return "test_fail"; }
  std::vector<Tensor> apply(const std::vector<Tensor>&) override {
    MIXPREC_FAIL("test_fail: backward failed on purpose");
  }
};

Tensor test_fail(const Tensor& x) {
  Tensor y = x.detach().clone();
  if (auto node = make_node<FailBackward>({&x})) attach_output(node, y);
  return y;
}

// A leaf of `dtype` whose .grad is kept in F32, as a 16-bit parameter's working copy is.
Tensor f32_grad_leaf(const std::vector<float>& values, DType dtype) {
  Tensor leaf = Tensor::from_vector(values, {static_cast<int64_t>(values.size())}, dtype);
  leaf.set_requires_grad(true);
  leaf.set_grad_dtype(DType::F32);
  return leaf;
}

double sum_all(const Tensor& t) {
  double s = 0;
  for (float v : t.to_float_vector()) s += v;
  return s;
}

}  // namespace

TEST_CASE("leaves, grad_fn and requires_grad propagate", "[autograd]") {
  Tensor x = Tensor::from_vector({1, 2, 3}, {3});
  CHECK(!x.requires_grad());
  CHECK(x.is_leaf());
  x.set_requires_grad(true);
  const Tensor y = test_square(x);
  CHECK(y.requires_grad());
  CHECK(!y.is_leaf());
  REQUIRE(y.grad_fn());
  CHECK(y.grad_fn()->name() == "test_square");
  const Tensor c = Tensor::from_vector({1, 1, 1}, {3});
  CHECK(!test_square(c).requires_grad());
  Tensor y2 = y;
  REQUIRE_THROWS_WITH(y2.set_requires_grad(false), Catch::Contains("only leaf tensors"));
  Tensor ints = Tensor::zeros({2}, DType::I32);
  REQUIRE_THROWS_WITH(ints.set_requires_grad(true), Catch::Contains("only floating tensors"));
}

TEST_CASE("backward through a diamond sums both paths", "[autograd]") {
  // z = x^2 + (x^2)^2 -> dz/dx = 2x + 4x^3
  Tensor x = Tensor::from_vector({0.5f, -1.5f, 2.f}, {3});
  x.set_requires_grad(true);
  const Tensor s = test_square(x);
  const Tensor z = test_add(s, test_square(s));
  z.backward(Tensor::ones({3}));
  const std::vector<float> g = x.grad().to_float_vector();
  const std::vector<float> xs = {0.5f, -1.5f, 2.f};
  for (int i = 0; i < 3; ++i) CHECK(g[i] == Approx(2 * xs[i] + 4 * xs[i] * xs[i] * xs[i]));
}

TEST_CASE("gradients accumulate by default and overwrite on request", "[autograd]") {
  Tensor x = Tensor::from_vector({3.f}, {1});
  x.set_requires_grad(true);
  test_square(x).backward();
  CHECK(x.grad().item() == 6.0);
  test_square(x).backward();
  CHECK(x.grad().item() == 12.0);
  BackwardOptions overwrite;
  overwrite.grad_mode = GradMode::Overwrite;
  test_square(x).backward(Tensor(), overwrite);
  CHECK(x.grad().item() == 6.0);
  x.reset_grad();
  CHECK(!x.grad().defined());
}

TEST_CASE("a leaf used twice receives the sum of both gradients", "[autograd]") {
  Tensor x = Tensor::from_vector({2.f}, {1});
  x.set_requires_grad(true);
  test_add(x, x).backward();
  CHECK(x.grad().item() == 2.0);
}

TEST_CASE("saved tensors are freed after backward, a second backward is an error", "[autograd]") {
  Tensor x = Tensor::from_vector({2.f}, {1});
  x.set_requires_grad(true);
  const Tensor y = test_square(x);
  y.backward();
  REQUIRE_THROWS_WITH(y.backward(), Catch::Contains("a second time") &&
                                        Catch::Contains("test_square") &&
                                        Catch::Contains("retain_graph=true"));
  auto* node = dynamic_cast<SquareBackward*>(y.grad_fn().get());
  REQUIRE(node);
  CHECK(!node->x.defined());  // the saved input was released

  const Tensor y2 = test_square(x);
  x.reset_grad();
  y2.backward(Tensor(), {.retain_graph = true});
  y2.backward();
  CHECK(x.grad().item() == 8.0);
}

TEST_CASE("each node runs exactly once even with many consumers", "[autograd]") {
  int calls = 0;
  Tensor x = Tensor::from_vector({1.f}, {1});
  x.set_requires_grad(true);
  const Tensor s = test_square(x, &calls);
  Tensor total = s;
  for (int i = 0; i < 5; ++i) total = test_add(total, s);
  total.backward();
  CHECK(calls == 1);
  CHECK(x.grad().item() == 12.0);  // 6 uses of x^2 -> 6 * 2x
}

TEST_CASE("NoGradGuard records nothing", "[autograd]") {
  Tensor x = Tensor::from_vector({1.f}, {1});
  x.set_requires_grad(true);
  {
    NoGradGuard guard;
    CHECK(!grad_enabled());
    const Tensor y = test_square(x);
    CHECK(!y.requires_grad());
    CHECK(!y.grad_fn());
  }
  CHECK(grad_enabled());
  CHECK(test_square(x).requires_grad());
}

TEST_CASE("backward errors name the problem", "[autograd]") {
  const Tensor c = Tensor::from_vector({1.f, 2.f}, {2});
  REQUIRE_THROWS_WITH(c.backward(Tensor::ones({2})), Catch::Contains("does not require grad"));
  Tensor x = Tensor::from_vector({1.f, 2.f}, {2});
  x.set_requires_grad(true);
  const Tensor y = test_square(x);
  REQUIRE_THROWS_WITH(y.backward(), Catch::Contains("non-scalar") && Catch::Contains("F32[2]"));
  REQUIRE_THROWS_WITH(y.backward(Tensor::ones({3})), Catch::Contains("does not match"));
}

TEST_CASE("leaf gradients can be kept in FP32 for an FP16 leaf", "[autograd]") {
  Tensor w = Tensor::from_vector({3.f}, {1}, DType::F16);
  w.set_requires_grad(true);
  w.set_grad_dtype(DType::F32);
  test_square(w).backward();
  REQUIRE(w.grad().dtype() == DType::F32);
  CHECK(w.grad().item() == 6.0);
}

TEST_CASE("every node receives its gradients in its outputs' dtypes", "[autograd]") {
  // The root gradient is F32 and every test_widen returns F32 gradients for F16 inputs; the
  // engine converts each one, even a single gradient that is not summed with another.
  Tensor x = Tensor::from_vector({1.5f, -2.f}, {2}, DType::F16);
  x.set_requires_grad(true);
  DType inner = DType::I32, outer = DType::I32;
  const Tensor y = test_widen(test_widen(x, &inner), &outer);
  y.backward(Tensor::from_vector({0.1f, 3.f}, {2}));
  CHECK(outer == DType::F16);
  CHECK(inner == DType::F16);
  REQUIRE(x.grad().dtype() == DType::F16);
  CHECK(x.grad().get(0) == static_cast<double>(half_bits_to_float(float_to_half_bits(0.1f))));
  CHECK(x.grad().get(1) == 3.0);
}

TEST_CASE("cast is differentiable and carries gradients back to FP32 masters", "[autograd]") {
  Tensor master = Tensor::from_vector({0.1f, 3.f}, {2});
  master.set_requires_grad(true);
  const Tensor working = master.to(DType::F16);
  CHECK(working.dtype() == DType::F16);
  const Tensor y = test_square(working);
  y.backward(Tensor::ones({2}, DType::F16));
  REQUIRE(master.grad().dtype() == DType::F32);
  const float w0 = half_bits_to_float(float_to_half_bits(0.1f));
  CHECK(master.grad().get(0) == static_cast<double>(half_bits_to_float(float_to_half_bits(2 * w0))));
  CHECK(master.grad().get(1) == 6.0);
}

TEST_CASE("reshape is differentiable", "[autograd]") {
  Tensor x = Tensor::arange(0, 6);
  x.set_requires_grad(true);
  const Tensor y = test_square(x.reshape({2, 3}));
  y.backward(Tensor::ones({2, 3}));
  CHECK(x.grad().shape() == Shape{6});
  CHECK(x.grad().get(5) == 10.0);
}

TEST_CASE("anomaly mode names the op and layer that produced a non-finite value", "[autograd]") {
  Tensor x = Tensor::from_vector({1e30f}, {1});
  x.set_requires_grad(true);
  {
    // Off: no check, the overflow passes silently.
    const Tensor y = test_square(x);
    CHECK(std::isinf(y.item()));
  }
  AnomalyModeGuard anomaly;
  {
    LayerScope outer("encoder");
    LayerScope inner("3");
    REQUIRE_THROWS_WITH(test_square(x), Catch::Contains("'test_square'") &&
                                            Catch::Contains("layer 'encoder.3'") &&
                                            Catch::Contains("Inf or NaN"));
  }
  // Forward finite (1e20), gradient overflows: 2 * 1e10 * 1e30 = inf.
  Tensor w = Tensor::from_vector({1e10f}, {1});
  w.set_requires_grad(true);
  const Tensor y = test_square(w);
  REQUIRE_THROWS_WITH(y.backward(Tensor::from_vector({1e30f}, {1})),
                      Catch::Contains("gradient computed by 'test_square'"));
}

TEST_CASE("very deep graphs neither overflow the stack in backward nor in destruction", "[autograd]") {
  Tensor x = Tensor::from_vector({1.f}, {1});
  x.set_requires_grad(true);
  {
    Tensor y = x;
    for (int i = 0; i < 200000; ++i) y = y.reshape({1});
    y.backward();
    CHECK(x.grad().item() == 1.0);
  }
  CHECK(sum_all(x.grad()) == 1.0);
}

TEST_CASE("16-bit gradients reach F32 .grad buffers accumulated and overwritten as before",
          "[autograd]") {
  for (DType dtype : {DType::F16, DType::BF16}) {
    INFO(dtype);
    Tensor a = f32_grad_leaf({1.0f, 2.0f, 3.0f}, dtype);
    Tensor b = f32_grad_leaf({4.0f, 5.0f, 6.0f}, dtype);
    const Tensor seed = Tensor::from_vector({0.75f, -2.5f, 0.0625f}, {3}, dtype);
    // a's gradient is 2 * a * seed, b's the seed: each leaf must get its own.
    const std::vector<float> ga{1.5f, -10.0f, 0.375f}, gb{0.75f, -2.5f, 0.0625f};
    test_add(test_square(a), b).backward(seed);
    REQUIRE(a.grad().dtype() == DType::F32);
    REQUIRE(b.grad().dtype() == DType::F32);
    CHECK(a.grad().to_float_vector() == ga);
    CHECK(b.grad().to_float_vector() == gb);
    // Accumulation is in place: a handle taken before sees the sum.
    const Tensor before = a.grad();
    test_add(test_square(a), b).backward(seed);
    CHECK(before.to_float_vector() == std::vector<float>{3.0f, -20.0f, 0.75f});
    CHECK(a.grad().is_same(before));
    CHECK(b.grad().to_float_vector() == std::vector<float>{1.5f, -5.0f, 0.125f});
    BackwardOptions overwrite;
    overwrite.grad_mode = GradMode::Overwrite;
    test_add(test_square(a), b).backward(seed, overwrite);
    CHECK(a.grad().to_float_vector() == ga);
    CHECK(before.to_float_vector() == std::vector<float>{3.0f, -20.0f, 0.75f});
  }
}

TEST_CASE("a backward that fails part-way leaves the gradients it delivered", "[autograd]") {
  Tensor a = f32_grad_leaf({1.0f, 2.0f}, DType::F16);
  Tensor x = Tensor::from_vector({3.0f, 4.0f}, {2}, DType::F16);
  x.set_requires_grad(true);
  // The engine reaches a's accumulator first (the later input is taken first), then fails.
  const Tensor z = test_add(test_fail(x), a);
  REQUIRE_THROWS_WITH(z.backward(Tensor::from_vector({0.5f, -1.25f}, {2}, DType::F16)),
                      Catch::Contains("failed on purpose"));
  REQUIRE(a.grad().defined());
  CHECK(a.grad().to_float_vector() == std::vector<float>{0.5f, -1.25f});
  CHECK(!x.grad().defined());
}

TEST_CASE("16-bit gradients of leaves sharing one .grad buffer are all added to it",
          "[autograd]") {
  Tensor a = f32_grad_leaf({1.0f, 2.0f}, DType::F16);
  Tensor b = f32_grad_leaf({3.0f, 4.0f}, DType::F16);
  Tensor c = f32_grad_leaf({5.0f, 6.0f}, DType::F16);
  const Tensor shared = Tensor::from_vector({1.0f, 2.0f}, {2}, DType::F32);
  a.set_grad(shared);
  b.set_grad(shared);
  // a gets 2 * a * seed = {1, -4}, b and c the seed {0.5, -1}.
  test_add(test_add(test_square(a), b), c).backward(Tensor::from_vector({0.5f, -1.0f}, {2}, DType::F16));
  CHECK(shared.to_float_vector() == std::vector<float>{2.5f, -3.0f});
  CHECK(a.grad().is_same(shared));
  CHECK(c.grad().to_float_vector() == std::vector<float>{0.5f, -1.0f});
}

TEST_CASE("a grad_tap callback sees the .grad of leaves reached before it complete",
          "[autograd]") {
  Tensor w = f32_grad_leaf({1.0f, 2.0f}, DType::F16);
  w.set_grad(Tensor::from_vector({10.0f, 10.0f}, {2}, DType::F32));
  Tensor x = Tensor::from_vector({3.0f, 4.0f}, {2}, DType::F16);
  x.set_requires_grad(true);
  std::vector<float> seen;
  // The engine reaches w's accumulator before the tap (the later input is taken first).
  const Tensor z = test_add(ops::grad_tap(x, [&](const Tensor&) { seen = w.grad().to_float_vector(); }), w);
  z.backward(Tensor::from_vector({0.5f, 0.25f}, {2}, DType::F16));
  CHECK(seen == std::vector<float>{10.5f, 10.25f});
}
