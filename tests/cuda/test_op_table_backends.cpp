// Mode 3 of the op table (tests/ops/op_table.h): every draw of every entry, the small ones
// and then kOpLargeDraws large ones, runs through the ops on the CPU (the reference) and on
// the CUDA backend, forward and backward, in F32, F16 and BF16 on the same values and with
// the same incoming gradient. The output and every
// floating input's gradient must match bit for bit where the entry says both backends round
// alike (backend_bits), else within tolerance_for(dtype) relative to the element and to the
// largest reference value.
//
// The ops allocate their outputs themselves, so the poison reaches them through the caching
// allocator: before each run its free blocks of the small size classes are poisoned, and an
// output the GPU leaves unwritten holds the poison, which the comparisons accept only where
// the CPU's output holds it too. (A block freed within the run and handed out again holds
// that run's values instead; the primitives' own tests poison every output directly.)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_backend_access.h"
#include "tests/core/gradcheck.h"
#include "tests/ops/op_table.h"

namespace mixprec::cuda_test {
namespace {

using namespace op_table;

// The largest request whose size class is poisoned (at least; a case with a larger input or
// output poisons up to that one's size), and the blocks poisoned per class: more than any op
// of the table takes of one class at once at its shapes.
constexpr size_t kPoisonedUpTo = 16384;
constexpr int kPoisonedBlocks = 6;

// Fills the allocator's cache with poisoned blocks of every size class up to `up_to` bytes.
void poison_cached_blocks(DType dtype, size_t up_to) {
  std::vector<size_t> classes;
  for (size_t bytes = 4; bytes <= up_to; bytes += 4) {
    const size_t size = CachingAllocator::round_size(bytes);
    if (classes.empty() || classes.back() != size) classes.push_back(size);
  }
  std::vector<Tensor> blocks;
  const int64_t esize = static_cast<int64_t>(dtype_size(dtype));
  for (size_t size : classes)
    for (int i = 0; i < kPoisonedBlocks; ++i)
      blocks.push_back(poisoned({static_cast<int64_t>(size) / esize}, dtype));
  // Freed here: the blocks go back to the cache, poisoned.
}

double largest_abs(const Tensor& t) {
  double m = 0;
  for (float v : t.to_float_vector())
    if (std::isfinite(v)) m = std::max(m, static_cast<double>(std::abs(v)));
  return m;
}

// The CPU's result against the GPU's: bit for bit, or within the dtype's tolerance with the
// absolute part scaled by the largest reference value.
void expect_agree(const Tensor& expected, const Tensor& actual, bool bitwise) {
  REQUIRE(actual.device() == gpu());
  if (bitwise) {
    expect_bits_equal(expected, actual);
    return;
  }
  Tolerance tol = tolerance_for(expected.dtype());
  tol.atol *= std::max(1.0, largest_abs(expected));
  expect_close(expected, actual, tol);
}

// The case's inputs in `dtype` (floating ones; I32 stay) on `device`, the floating ones
// differentiable leaves.
std::vector<Tensor> leaves_on(const std::vector<Tensor>& inputs, DType dtype, Device device) {
  std::vector<Tensor> out;
  for (const Tensor& t : inputs) {
    if (!is_floating(t.dtype())) {
      out.push_back(t.to(device));
      continue;
    }
    Tensor leaf = t.detach().to(dtype).to(device);
    if (leaf.device() == t.device() && dtype == t.dtype()) leaf = leaf.clone();
    out.push_back(leaf.set_requires_grad(true));
  }
  return out;
}

void check_backends_agree(const OpEntry& entry, const OpCase& c, DType dtype, uint64_t seed) {
  std::vector<Tensor> cpu_in = leaves_on(c.inputs, dtype, kCPU);
  std::vector<Tensor> gpu_in = leaves_on(cpu_in, dtype, gpu());
  const Tensor expected = c.fn(cpu_in);
  size_t poisoned_up_to = std::max(kPoisonedUpTo, expected.nbytes());
  for (const Tensor& t : cpu_in) poisoned_up_to = std::max(poisoned_up_to, t.nbytes());
  poison_cached_blocks(expected.dtype(), poisoned_up_to);
  const Tensor actual = c.fn(gpu_in);
  {
    INFO("forward");
    expect_agree(expected, actual, entry.backend_bits.forward);
  }
  const Tensor g = testing::random_tensor(expected.shape(), seed, -1.f, 1.f, expected.dtype());
  expected.backward(g);
  poison_cached_blocks(dtype, poisoned_up_to);
  actual.backward(g.to(gpu()));
  for (size_t i = 0; i < cpu_in.size(); ++i) {
    if (!is_floating(cpu_in[i].dtype())) continue;
    INFO("gradient of input " << i);
    REQUIRE(cpu_in[i].grad().defined());
    REQUIRE(gpu_in[i].grad().defined());
    expect_agree(cpu_in[i].grad(), gpu_in[i].grad(), entry.backend_bits.backward);
  }
}

TEST_CASE("op table: CUDA forward and backward match the CPU in every dtype", "[cuda][sweep]") {
  MIXPREC_REQUIRE_CUDA();
  for (const OpEntry& entry : op_entries()) {
    DYNAMIC_SECTION(entry.op << " (" << entry.variant << ")") {
      OpRng small_rng(op_seed(entry)), large_rng(op_seed(entry) + 1);
      for (int draw = 0; draw < kOpDraws + kOpLargeDraws; ++draw) {
        const bool large = draw >= kOpDraws;
        const OpCase c = large ? entry.make(large_rng, draw, kLargeDraw)
                               : entry.make(small_rng, draw, kSmallDraw);
        INFO(case_label(entry, draw, c));
        for (DType dtype : kFloatingTypes) {
          INFO(dtype_name(dtype));
          check_backends_agree(entry, c, dtype, 2000 + static_cast<uint64_t>(draw));
        }
      }
    }
  }
}

}  // namespace
}  // namespace mixprec::cuda_test
