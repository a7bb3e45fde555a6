// Modes 1 and 2 of the op table (tests/ops/op_table.h), on the CPU. On every draw of every
// entry:
//   1. the FP32 gradient of every floating input against finite differences (gradcheck),
//      whose sums in double are the reference;
//   2. the F16 and BF16 forward and backward against the F32 ones. Both runs see the same
//      values (the inputs are rounded to the 16-bit format first), so only the op's own
//      roundings are measured, and the tolerance is a few units of the format's precision
//      relative to the largest reference value; for the entries that only move values
//      (low_precision_exact) the results must be the F32 ones rounded, bit for bit;
// and an input with a zero extent throws mixprec::Error naming the op. A failure prints the
// entry, the draw and the drawn shapes and parameters.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "gradcheck.h"
#include "tests/ops/op_table.h"

namespace mixprec {
namespace {

using Catch::Contains;
using namespace testing;
using namespace op_table;

// F16/BF16 against F32, in units of the format's rtol (low_precision_rtol): the output and
// the gradient are each rounded once or twice.
constexpr double kLowTol = 2.0;

double sweep_max_abs(const Tensor& t) {
  double m = 0;
  for (float v : t.to_float_vector()) m = std::max(m, static_cast<double>(std::abs(v)));
  return m;
}

std::vector<Tensor> rounded_to(const std::vector<Tensor>& inputs, DType dtype) {
  std::vector<Tensor> out;
  for (const Tensor& t : inputs)
    out.push_back(is_floating(t.dtype()) ? t.detach().to(dtype).to(DType::F32) : t);
  return out;
}

// `low` equals `reference` rounded to low's dtype, bit for bit.
void require_rounded_equal(const Tensor& low, const Tensor& reference, const std::string& what) {
  INFO(what << ": the F32 result rounded, bit for bit");
  REQUIRE(low.shape() == reference.shape());
  CHECK(bits_of(low) == bits_of(reference.to(low.dtype())));
}

// The forward in `dtype` against F32 on the same (rounded) values, within tol units of the
// format's rtol relative to the element and to the largest reference value, or bit for bit
// when `exact`.
void check_forward(const std::string& label, const OpCase& c,
                   const std::vector<Tensor>& rounded, DType dtype, bool exact) {
  if (exact) {
    NoGradGuard no_grad;
    std::vector<Tensor> low;
    for (const Tensor& t : rounded) low.push_back(is_floating(t.dtype()) ? t.to(dtype) : t);
    require_rounded_equal(c.fn(low), c.fn(rounded), label + " " + std::string(dtype_name(dtype)));
    return;
  }
  double scale;
  {
    NoGradGuard no_grad;
    scale = std::max(1.0, sweep_max_abs(c.fn(rounded)));
  }
  check_low_precision(label, c.fn, rounded, dtype, kLowTol * scale);
}

// One backward in `dtype` and the same in F32 on the same values (and the same incoming
// gradient). Every floating input's gradient keeps its dtype and matches within tol units of
// the format's rtol relative to the largest reference gradient (or to grad_floor when that
// is larger), or bit for bit when `exact`.
void check_backward(const std::string& label, const OpCase& c,
                    const std::vector<Tensor>& rounded, DType dtype, uint64_t seed, bool exact) {
  std::vector<Tensor> low, full;
  for (const Tensor& t : rounded) {
    const bool floating = is_floating(t.dtype());
    low.push_back(floating ? t.detach().to(dtype).set_requires_grad(true) : t);
    full.push_back(floating ? t.detach().clone().set_requires_grad(true) : t);
  }
  const Tensor y = c.fn(low);
  REQUIRE(y.dtype() == (c.f32_output ? DType::F32 : dtype));
  const Tensor g = random_tensor(y.shape(), seed, -1.f, 1.f, y.dtype());
  y.backward(g);
  c.fn(full).backward(g.to(DType::F32));
  const double tol = kLowTol * low_precision_rtol(dtype);
  for (size_t i = 0; i < low.size(); ++i) {
    if (!is_floating(low[i].dtype())) continue;
    const std::string what =
        label + " grad " + std::to_string(i) + " " + std::string(dtype_name(dtype));
    INFO(what);
    REQUIRE(low[i].grad().defined());
    REQUIRE(low[i].grad().dtype() == dtype);
    const Tensor reference = full[i].grad();
    if (exact) {
      require_rounded_equal(low[i].grad(), reference, what);
      continue;
    }
    require_close(low[i].grad(), reference, tol,
                  tol * std::max(sweep_max_abs(reference), c.grad_floor), what);
  }
}

// Runs `check(entry, label, case, draw)` on every draw of every entry, each entry in a
// section of its own. The entry's generator draws the cases only, so every mode sees the
// same cases.
template <class Check>
void for_each_case(const Check& check) {
  for (const OpEntry& entry : op_entries()) {
    DYNAMIC_SECTION(entry.op << " (" << entry.variant << ")") {
      OpRng rng(op_seed(entry));
      for (int draw = 0; draw < kOpDraws; ++draw) {
        OpCase c = entry.make(rng, draw, kSmallDraw);
        const std::string label = case_label(entry, draw, c);
        INFO(label);
        check(entry, label, c, draw);
      }
    }
  }
}

TEST_CASE("op table: FP32 gradients match finite differences", "[sweep]") {
  for_each_case([](const OpEntry&, const std::string& label, OpCase& c, int) {
    int64_t floating_numel = 0;
    for (Tensor& t : c.inputs)
      if (is_floating(t.dtype())) {
        t.set_requires_grad(true);
        floating_numel += t.numel();
      }
    REQUIRE(floating_numel <= kOpMaxElements);
    gradcheck(label, c.fn, c.inputs, c.grad);
  });
}

TEST_CASE("op table: F16 and BF16 forward and backward match F32", "[sweep]") {
  for_each_case([](const OpEntry& entry, const std::string& label, OpCase& c, int draw) {
    const bool exact = entry.low_precision_exact;
    for (DType dtype : {DType::F16, DType::BF16}) {
      const std::vector<Tensor> rounded = rounded_to(c.inputs, dtype);
      check_forward(label, c, rounded, dtype, exact);
      check_backward(label, c, rounded, dtype, 1000 + static_cast<uint64_t>(draw), exact);
    }
  });
}

TEST_CASE("op table: an input with a zero extent throws naming the op", "[sweep]") {
  for_each_case([](const OpEntry& entry, const std::string&, OpCase& c, int) {
    if (c.empty_inputs.empty()) return;
    std::string inputs;
    for (const Tensor& t : c.empty_inputs) inputs += describe(t) + " ";
    INFO("empty input: " << inputs);
    REQUIRE_THROWS_AS(c.fn(c.empty_inputs), Error);
    REQUIRE_THROWS_WITH(c.fn(c.empty_inputs), Contains(entry.op) && Contains("empty"));
  });
}

// Every op of core/ops/ops.h has an entry (the list below is the header's, in its order;
// grad_tap, an observer rather than a computation, has tests of its own).
TEST_CASE("op table: every op has an entry", "[sweep]") {
  const std::vector<std::string> declared = {
      "cast", "reshape", "flatten", "transpose", "permute", "concat", "split", "split_heads",
      "slice", "add", "sub", "mul", "div", "add_scalar", "mul_scalar", "neg", "exp", "log",
      "sqrt", "square", "relu", "gelu", "sigmoid", "tanh", "sum", "mean", "matmul", "linear",
      "linear_gelu", "conv2d", "max_pool2d", "avg_pool2d", "softmax", "log_softmax",
      "cross_entropy", "mse_loss", "layer_norm", "batch_norm2d", "embedding", "dropout",
      "dropout_add", "causal_attention"};
  for (const std::string& op : declared) {
    INFO(op);
    CHECK(std::any_of(op_entries().begin(), op_entries().end(),
                      [&](const OpEntry& e) { return op == e.op; }));
  }
}

}  // namespace
}  // namespace mixprec
