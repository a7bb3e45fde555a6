// The op table: every op of core/ops/ops.h declared once, in the manner of ggml's
// test-backend-ops, for the harnesses that run it in their own mode:
//   - tests/core/test_op_sweep.cpp: FP32 gradients against finite differences (a double
//     reference), F16/BF16 against F32, and the empty-input error, on the CPU;
//   - tests/cuda/test_op_table_backends.cpp: the CUDA backend (real or emulated) against the
//     CPU, forward and backward, in F32, F16 and BF16.
//
// Contract:
// - An entry draws cases from a std::mt19937 seeded by its own name (op_seed), so a case
//   repeats whatever the table's order, and so every harness sees the same cases.
// - A case's inputs are CPU tensors: F32 floating inputs (each one a differentiable input of
//   fn) and I32 labels/ids. fn builds its result from its inputs alone, on their device and
//   in their dtype; anything else it needs (a generator seed, running statistics) it makes
//   afresh each call, so two calls on equal inputs give equal results.
// - An entry draws at two sizes (OpSizes). The small draws (extents 1 to 7, at most
//   kOpMaxElements floating elements in all) keep a gradcheck of every element cheap, and
//   every mode runs them. The large draws (extents up to 70, thousands of elements, rows and
//   sums longer than a warp, grids of several blocks) are for the CUDA mode, where only the
//   forward and one backward run. Odd vector tails (1023, 4097 elements), rows in the
//   thousands and strided GEMM layouts stay the backend primitives' own tests' concern.
// - low_precision_exact: the op moves values without arithmetic, so its F16/BF16 output and
//   gradients are the F32 ones rounded to the format, bit for bit.
// - backend_bits says which of the op's passes the CPU and CUDA backends compute with the
//   same single rounding of each element (data movement, one arithmetic op), so they must
//   agree bit for bit; the other passes are compared within a tolerance.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "tests/core/gradcheck.h"

namespace mixprec::op_table {

using OpRng = std::mt19937;

// Draws per entry. Entries that cycle through configurations (trans flags, keepdim, bias,
// optional weights) do so with the draw index, so each configuration gets several draws.
inline constexpr int kOpDraws = 16;
// Floating elements of all inputs of one case together: gradcheck runs two forwards per
// element.
inline constexpr int64_t kOpMaxElements = 300;
// Large draws per entry, run by the CUDA mode after the small ones.
inline constexpr int kOpLargeDraws = 3;

// The sizes of one draw: each entry's limits for its small and its large draws.
struct OpSizes {
  bool large = false;
  constexpr int64_t pick(int64_t small, int64_t big) const { return large ? big : small; }
};
inline constexpr OpSizes kSmallDraw{false};
inline constexpr OpSizes kLargeDraw{true};

// Which passes of an op agree bit for bit between the backends.
struct BackendBits {
  bool forward = false;
  bool backward = false;
};

// One draw of one entry.
struct OpCase {
  std::string params;                // drawn op parameters, printed on failure
  std::vector<Tensor> inputs;        // F32 floating inputs and I32 labels/ids, on the CPU
  testing::TensorFn fn;
  std::vector<Tensor> empty_inputs;  // left empty for the ops that accept an empty input
  testing::GradcheckOptions grad = {};
  bool f32_output = false;           // the op returns F32 whatever its inputs' dtype
  // Smallest gradient scale that the 16-bit backward is compared at: raised where the
  // backward reads the op's rounded output through a difference that cancels, so its error
  // is a fraction of the incoming gradient rather than of the (possibly tiny) result.
  double grad_floor = 1e-6;
};

struct OpEntry {
  const char* op;       // the op's name, as its error messages spell it
  const char* variant;  // which configuration of the op the draws cover
  std::function<OpCase(OpRng&, int draw, const OpSizes&)> make;
  BackendBits backend_bits = {};
  bool low_precision_exact = false;
};

// The table, one or more entries per op of core/ops/ops.h.
const std::vector<OpEntry>& op_entries();

// The seed of an entry's small draws (FNV-1a of "op/variant"); its large draws use a
// generator of their own (op_seed + 1), so adding them changed no small draw.
uint32_t op_seed(const OpEntry& entry);

// "op (variant) draw N: inputs params", for failure messages.
std::string case_label(const OpEntry& entry, int draw, const OpCase& c);

}  // namespace mixprec::op_table
