// Backend::split_heads and merge_heads on the CUDA backend against the CPU, bit for bit,
// outputs poisoned first. Row lengths of 2, 8, 10, 12 and 16 bytes take each word size the
// kernel moves (2, 4, 8 and 16 bytes).
#include <random>

#include "tests/cuda/backend_agreement.h"

namespace mixprec::cuda_test {
namespace {

struct HeadsCase {
  int64_t batch, time, heads, dim;
  DType dtype;
};

TEST_CASE("cuda split_heads and merge_heads move every element as the CPU does", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(95);
  const HeadsCase cases[] = {{2, 3, 2, 1, DType::F16},  {2, 5, 3, 4, DType::F16},
                             {1, 4, 2, 5, DType::BF16}, {3, 2, 2, 3, DType::F32},
                             {2, 7, 6, 8, DType::F16},  {2, 3, 2, 4, DType::F32}};
  for (const HeadsCase& c : cases) {
    INFO("B " << c.batch << " T " << c.time << " H " << c.heads << " D " << c.dim << " "
              << c.dtype);
    const Shape packed{c.batch, c.time, 3 * c.heads * c.dim};
    const Shape split{c.batch, c.heads, c.time, c.dim};
    const Tensor qkv = random_tensor(packed, c.dtype, rng);
    Tensor cpu_parts[3] = {Tensor::empty(split, c.dtype), Tensor::empty(split, c.dtype),
                           Tensor::empty(split, c.dtype)};
    cpu_backend().split_heads(qkv, cpu_parts[0], cpu_parts[1], cpu_parts[2]);
    Tensor gpu_parts[3] = {poisoned(split, c.dtype), poisoned(split, c.dtype),
                           poisoned(split, c.dtype)};
    gpu_backend().split_heads(qkv.to(gpu()), gpu_parts[0], gpu_parts[1], gpu_parts[2]);
    for (int i = 0; i < 3; ++i) expect_bits_equal(cpu_parts[i], gpu_parts[i]);

    Tensor merged = poisoned(packed, c.dtype);
    gpu_backend().merge_heads(gpu_parts[0], gpu_parts[1], gpu_parts[2], merged);
    expect_bits_equal(qkv, merged);
  }
}

}  // namespace
}  // namespace mixprec::cuda_test
