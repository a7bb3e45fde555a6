// The index checks of embedding and cross-entropy on a device: indices that came from the
// host carry their bounds (Storage::index_bounds), so a check that passes does not wait for
// the device; anything else is searched on the device as before.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/generator.h"
#include "core/ops/ops.h"
#include "tests/cuda/backend_agreement.h"

namespace mixprec {
namespace {

using cuda_test::gpu;
using cuda_test::gpu_backend;

TEST_CASE("cuda embedding and cross-entropy check host-copied indices without a host sync",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  const int64_t vocab = 6, dim = 3;
  Generator gen(7);
  const Tensor weight_cpu = Tensor::normal({vocab, dim}, gen);
  const std::vector<int32_t> id_values = {0, 5, 2, 2, 4};
  const Tensor ids = Tensor::from_ints(id_values, {5}, gpu());
  const Tensor weight = weight_cpu.to(gpu());
  const uint64_t before = cuda_host_syncs();
  const Tensor rows = ops::embedding(weight, ids);
  const Tensor loss = ops::cross_entropy(ops::embedding(weight, ids).reshape({5, dim}),
                                         Tensor::from_ints({0, 2, 1, 1, 0}, {5}, gpu()));
  CHECK(cuda_host_syncs() == before);
  // And the rows are the right ones.
  const std::vector<float> got = rows.to_float_vector();
  const std::vector<float> table = weight_cpu.to_float_vector();
  for (size_t i = 0; i < id_values.size(); ++i)
    for (int64_t d = 0; d < dim; ++d)
      CHECK(got[i * dim + static_cast<size_t>(d)] == table[static_cast<size_t>(id_values[i] * dim + d)]);
  CHECK(std::isfinite(loss.item()));
}

TEST_CASE("cuda index checks still name an out-of-range index copied from the host", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  const Tensor weight = Tensor::zeros({4, 2}, DType::F32, gpu());
  const Tensor ids = Tensor::from_ints({1, 4, 0}, {3}, gpu());
  CHECK_THROWS_WITH(ops::embedding(weight, ids),
                    Catch::Contains("holds 4 at index 1") && Catch::Contains("[0, 4)"));
  const Tensor negative = Tensor::from_ints({-1, 0}, {2}, gpu());
  CHECK_THROWS_WITH(ops::cross_entropy(Tensor::zeros({2, 3}, DType::F32, gpu()), negative),
                    Catch::Contains("holds -1 at index 0"));
}

TEST_CASE("cuda indices rewritten on the device after their copy are checked on the device",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  const Tensor weight = Tensor::zeros({4, 2}, DType::F32, gpu());
  Tensor ids = Tensor::from_ints({0, 1, 2}, {3}, gpu());
  REQUIRE(ids.index_bounds().has_value());
  // A backend primitive writes 3, 4, 5 over the copied values: the bounds must not survive.
  gpu_backend().arange(ids, 3.0, 1.0);
  CHECK_FALSE(ids.index_bounds().has_value());
  CHECK_THROWS_WITH(ops::embedding(weight, ids), Catch::Contains("holds 4 at index 1"));
  // Indices made on the CPU never skip the check either.
  const Tensor host_ids = Tensor::from_ints({0, 9}, {2});
  CHECK_THROWS_WITH(ops::embedding(Tensor::zeros({4, 2}), host_ids),
                    Catch::Contains("holds 9 at index 1"));
}

TEST_CASE("cuda indices copied in place over a whole tensor keep their bounds", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  const Tensor weight = Tensor::zeros({4, 2}, DType::F32, gpu());
  // A fixed tensor refilled with copy_ (as a recorded training step's batch is): the bounds of
  // each new source replace the old ones, so a bad index still fails without a device search.
  Tensor fixed = Tensor::empty({3}, DType::I32, gpu());
  fixed.copy_(Tensor::from_ints({0, 1, 2}, {3}, gpu()));
  REQUIRE(fixed.index_bounds().has_value());
  CHECK(fixed.index_bounds()->lowest == 0);
  CHECK(fixed.index_bounds()->highest == 2);
  const uint64_t before = cuda_host_syncs();
  CHECK(ops::embedding(weight, fixed).shape() == Shape{3, 2});
  CHECK(cuda_host_syncs() == before);
  fixed.copy_(Tensor::from_ints({3, 7, 1}, {3}));  // from the host: bounds known there too
  REQUIRE(fixed.index_bounds().has_value());
  CHECK(fixed.index_bounds()->highest == 7);
  CHECK_THROWS_WITH(ops::embedding(weight, fixed), Catch::Contains("holds 7 at index 1"));
  // A source without bounds (written on the device) leaves none behind.
  Tensor unknown = Tensor::empty({3}, DType::I32, gpu());
  gpu_backend().arange(unknown, 0.0, 1.0);
  fixed.copy_(unknown);
  CHECK_FALSE(fixed.index_bounds().has_value());
  // Nor does a cast from floats.
  fixed.copy_(Tensor::from_ints({0, 1, 2}, {3}, gpu()));
  fixed.copy_(Tensor::zeros({3}, DType::F32, gpu()));
  CHECK_FALSE(fixed.index_bounds().has_value());
}

}  // namespace
}  // namespace mixprec
