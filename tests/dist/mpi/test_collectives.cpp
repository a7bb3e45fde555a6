// The collective contract (dist/communicator.h), run by every rank under
// `mpirun -np K` (K = 1 to 4, tests/CMakeLists.txt). Each rank regenerates every rank's input
// from a seed, so it checks its result against a reference computed locally. A failed check on
// any rank makes that rank, and so mpirun, exit non-zero. Checks are CHECKs, not REQUIREs, so
// that a failing rank goes on calling the same collectives as the others; a rank that falls
// out of step anyway is ended by the watchdog.
#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/tensor.h"
#include "dist/communicator.h"
#include "tests/error_message.h"
#include "tests/tensor_bytes.h"

using namespace mixprec;
using mixprec_test::error_message;

namespace {

dist::Communicator& comm() {
  static const std::unique_ptr<dist::Communicator> instance =
      dist::make_communicator("mpi", 30.0, kCPU);
  return *instance;
}

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Rank `rank`'s F32 input of `numel` values for test `seed`: mostly values whose sum depends
// on the order of the additions (1e8 next to 1, values near FLT_MAX), with signed zeros,
// subnormals and, where `specials`, a few infinities and NaNs.
std::vector<float> f32_input(uint32_t seed, int rank, int64_t numel, bool specials) {
  static const float kPalette[] = {1e8f,   -1e8f,  1.0f,    -1.0f,    0.0f,
                                   -0.0f,  1e-45f, -1e-45f, 1.2e-38f, 3e38f,
                                   -3e38f, 0.1f,   3.0f,    -7.5e7f,  16777216.0f};
  std::mt19937 rng(seed * 7919u + static_cast<uint32_t>(rank));
  std::uniform_int_distribution<int> pick(0, std::size(kPalette) - 1);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::uniform_int_distribution<int> percent(0, 99);
  std::vector<float> values(numel);
  for (float& v : values) {
    const int p = percent(rng);
    if (specials && p < 2) {
      v = p == 0 ? kNaN : (percent(rng) < 50 ? kInf : -kInf);
    } else if (p < 60) {
      v = kPalette[pick(rng)];
    } else {
      v = uniform(rng) * std::ldexp(1.0f, static_cast<int>(percent(rng)) / 3 - 10);
    }
  }
  return values;
}

// Bytes of rank `rank`'s tensor for test `seed`: any bit pattern (NaNs of every payload
// included), since gathers and broadcasts carry bits.
std::vector<uint8_t> random_bytes(uint32_t seed, int rank, size_t count) {
  std::mt19937 rng(seed * 104729u + static_cast<uint32_t>(rank));
  std::vector<uint8_t> bytes(count);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }

// Whether every rank holds the same `values` (a hash of their bits, compared across ranks).
bool same_on_every_rank(const std::vector<uint8_t>& values) {
  uint64_t hash = 1469598103934665603ull;
  for (uint8_t b : values) hash = (hash ^ b) * 1099511628211ull;
  const std::vector<int64_t> all = comm().all_gather_int(static_cast<int64_t>(hash >> 1));
  return std::all_of(all.begin(), all.end(), [&](int64_t h) { return h == all[0]; });
}

const DType kDTypes[] = {DType::F32, DType::F16, DType::BF16, DType::I32};

}  // namespace

TEST_CASE("the mpi backend under mpirun has mpirun's ranks", "[dist][mpi]") {
  const char* world = std::getenv("OMPI_COMM_WORLD_SIZE");
  REQUIRE(world != nullptr);
  CHECK(comm().backend() == "mpi");
  CHECK(comm().size() == std::atoi(world));
  CHECK(comm().rank() == std::atoi(std::getenv("OMPI_COMM_WORLD_RANK")));
  CHECK(comm().device() == kCPU);
}

TEST_CASE("sum_in_rank_order: the bits of a serial sum from +0 in rank order, on every rank",
          "[dist][mpi]") {
  const int n_ranks = comm().size();
  int64_t order_mattered = 0;
  uint32_t seed = 1;
  for (int64_t numel : {int64_t{0}, int64_t{1}, int64_t{n_ranks - 1}, int64_t{n_ranks},
                        int64_t{n_ranks + 1}, int64_t{7}, int64_t{1000}, int64_t{4099}}) {
    for (bool specials : {false, true}) {
      CAPTURE(numel, specials, comm().rank());
      ++seed;
      Tensor values = Tensor::from_vector(f32_input(seed, comm().rank(), numel, specials), {numel});
      comm().sum_in_rank_order(values);
      REQUIRE(values.numel() == numel);
      std::vector<float> serial(numel, +0.0f), reversed(numel, +0.0f);
      for (int r = 0; r < n_ranks; ++r) {
        const std::vector<float> in = f32_input(seed, r, numel, specials);
        const std::vector<float> in_reverse = f32_input(seed, n_ranks - 1 - r, numel, specials);
        for (int64_t i = 0; i < numel; ++i) {
          serial[i] = serial[i] + in[i];
          reversed[i] = reversed[i] + in_reverse[i];
        }
      }
      const float* got = values.data_as<float>();
      int64_t wrong = 0;
      for (int64_t i = 0; i < numel; ++i) {
        // IEEE leaves a NaN's payload open (x86 keeps the first operand's): NaN is checked as
        // NaN, and every rank holding the same bits is checked below.
        const bool ok =
            std::isnan(serial[i]) ? std::isnan(got[i]) : bits(got[i]) == bits(serial[i]);
        if (!ok) ++wrong;
        if (!std::isnan(serial[i]) && bits(reversed[i]) != bits(serial[i])) ++order_mattered;
      }
      CHECK(wrong == 0);
      CHECK(same_on_every_rank(mixprec_test::raw_bytes(values)));
    }
  }
  // The inputs are such that the reverse order gives other bits, so a sum in another order
  // would fail the checks above.
  if (n_ranks >= 3) CHECK(order_mattered > 100);
}

TEST_CASE("sum_in_rank_order: -0 on every rank sums to +0, as from +0", "[dist][mpi]") {
  Tensor values = Tensor::from_vector(std::vector<float>(5, -0.0f), {5});
  comm().sum_in_rank_order(values);
  for (uint32_t b : mixprec_test::float_bits(values)) CHECK(b == bits(0.0f));
}

TEST_CASE("max: elementwise over ranks, NaN on any one rank wins, +0 above -0", "[dist][mpi]") {
  const int n_ranks = comm().size();
  const int64_t numel = 2003;
  // Element 0 is NaN on the last rank only, element 1 on rank 0 only, the others +inf there.
  const auto input = [&](int r) {
    std::vector<float> v = f32_input(99, r, numel, true);
    v[0] = r == n_ranks - 1 ? kNaN : kInf;
    v[1] = r == 0 ? kNaN : kInf;
    v[2] = r % 2 == 0 ? -0.0f : 0.0f;
    v[3] = -0.0f;
    return v;
  };
  Tensor values = Tensor::from_vector(input(comm().rank()), {numel});
  comm().max(values);
  std::vector<float> expected(numel, -kInf);
  std::vector<bool> nan(numel, false);
  for (int r = 0; r < n_ranks; ++r) {
    const std::vector<float> in = input(r);
    for (int64_t i = 0; i < numel; ++i) {
      if (std::isnan(in[i]))
        nan[i] = true;
      else if (in[i] > expected[i] || (in[i] == expected[i] && !std::signbit(in[i])))
        expected[i] = in[i];
    }
  }
  const float* got = values.data_as<float>();
  CHECK(std::isnan(got[0]));
  CHECK(std::isnan(got[1]));
  CHECK(bits(got[2]) == bits(n_ranks > 1 ? 0.0f : -0.0f));
  CHECK(bits(got[3]) == bits(-0.0f));
  int64_t wrong = 0;
  for (int64_t i = 0; i < numel; ++i) {
    if (nan[i] ? !std::isnan(got[i]) : bits(got[i]) != bits(expected[i])) ++wrong;
  }
  CHECK(wrong == 0);
  CHECK(same_on_every_rank(mixprec_test::raw_bytes(values)));
}

TEST_CASE("max: I32, elementwise over ranks", "[dist][mpi]") {
  const auto input = [](int r) {
    std::vector<int32_t> v = {std::numeric_limits<int32_t>::min(), -5, 0, 17};
    std::mt19937 rng(r + 5);
    for (int i = 0; i < 100; ++i) v.push_back(static_cast<int32_t>(rng()));
    v[r % 4] = std::numeric_limits<int32_t>::max() - r;
    return v;
  };
  const std::vector<int32_t> mine = input(comm().rank());
  Tensor values = Tensor::from_ints(mine, {static_cast<int64_t>(mine.size())});
  comm().max(values);
  std::vector<int32_t> expected = input(0);
  for (int r = 1; r < comm().size(); ++r) {
    const std::vector<int32_t> in = input(r);
    for (size_t i = 0; i < in.size(); ++i) expected[i] = std::max(expected[i], in[i]);
  }
  CHECK(values.to_int_vector() == expected);
  Tensor empty = Tensor::empty({0}, DType::I32);
  comm().max(empty);
  CHECK(empty.numel() == 0);
}

TEST_CASE("all_gather: every rank's tensor in rank order, uneven and empty, every dtype",
          "[dist][mpi]") {
  const int n_ranks = comm().size();
  uint32_t seed = 200;
  for (DType dtype : kDTypes) {
    // Sizes per rank: uneven with empties; all empty; one element each.
    for (int pattern = 0; pattern < 3; ++pattern) {
      CAPTURE(dtype, pattern, comm().rank());
      ++seed;
      const auto numel_of = [&](int r) -> int64_t {
        return pattern == 0 ? (r * 5 + 3) % 7 : pattern == 1 ? 0 : 1;
      };
      const size_t width = dtype_size(dtype);
      const int me = comm().rank();
      Tensor mine = mixprec_test::tensor_from_bytes(random_bytes(seed, me, numel_of(me) * width),
                                                    {numel_of(me)}, dtype);
      const Tensor all = comm().all_gather(mine);
      std::vector<uint8_t> expected;
      for (int r = 0; r < n_ranks; ++r) {
        const std::vector<uint8_t> part = random_bytes(seed, r, numel_of(r) * width);
        expected.insert(expected.end(), part.begin(), part.end());
      }
      CHECK(all.dtype() == dtype);
      CHECK(all.dim() == 1);
      CHECK(all.numel() * static_cast<int64_t>(width) == static_cast<int64_t>(expected.size()));
      CHECK(mixprec_test::raw_bytes(all) == expected);
    }
  }
}

TEST_CASE("broadcast: root's values on every rank, every dtype and root", "[dist][mpi]") {
  uint32_t seed = 300;
  for (DType dtype : kDTypes) {
    for (int root = 0; root < comm().size(); ++root) {
      for (int64_t numel : {0, 1, 1001}) {
        CAPTURE(dtype, root, numel, comm().rank());
        ++seed;
        const size_t nbytes = numel * dtype_size(dtype);
        Tensor values = mixprec_test::tensor_from_bytes(random_bytes(seed, comm().rank(), nbytes),
                                                        {numel}, dtype);
        comm().broadcast(values, root);
        CHECK(mixprec_test::raw_bytes(values) == random_bytes(seed, root, nbytes));
      }
    }
  }
}

TEST_CASE("broadcast_bytes: root's bytes on every rank, whatever size each had", "[dist][mpi]") {
  for (int root = 0; root < comm().size(); ++root) {
    for (size_t root_size : {size_t{0}, size_t{1}, size_t{70000}}) {
      const int me = comm().rank();
      const size_t my_size = me == root ? root_size : static_cast<size_t>(me * 13 + 2);
      const std::vector<uint8_t> got =
          comm().broadcast_bytes(random_bytes(400 + root, me, my_size), root);
      CHECK(got == random_bytes(400 + root, root, root_size));
    }
  }
}

TEST_CASE("all_gather_int: every rank's value in rank order", "[dist][mpi]") {
  const auto value = [](int r) { return (int64_t{1} << 40) * (r + 1) - 7 * r; };
  std::vector<int64_t> expected;
  for (int r = 0; r < comm().size(); ++r) expected.push_back(value(r));
  CHECK(comm().all_gather_int(value(comm().rank())) == expected);
}

TEST_CASE("barrier: no rank leaves it before the last has entered it", "[dist][mpi]") {
  using Clock = std::chrono::steady_clock;  // CLOCK_MONOTONIC: one clock for every process
  comm().barrier();
  const int last = comm().size() - 1;
  if (comm().rank() == last) std::this_thread::sleep_for(std::chrono::milliseconds(150));
  const int64_t entered = Clock::now().time_since_epoch().count();
  comm().barrier();
  const int64_t left = Clock::now().time_since_epoch().count();
  const std::vector<int64_t> entries = comm().all_gather_int(entered);
  CHECK(left >= entries[last]);
}

TEST_CASE("collectives: dtype and root errors are thrown on every rank alike", "[dist][mpi]") {
  Tensor half = Tensor::zeros({4}, DType::F16);
  CHECK(error_message([&] { comm().sum_in_rank_order(half); }) ==
        "sum_in_rank_order: F32 values, got F16[4]");
  CHECK(error_message([&] { comm().max(half); }) == "max: F32 or I32 values, got F16[4]");
  Tensor matrix = Tensor::zeros({2, 2});
  CHECK(error_message([&] { comm().all_gather(matrix); }) ==
        "all_gather: a 1-D tensor, got F32[2, 2]");
  Tensor values = Tensor::zeros({3});
  const std::string root_error = "broadcast: root " + std::to_string(comm().size()) +
                                 " is not a rank of " + std::to_string(comm().size());
  CHECK(error_message([&] { comm().broadcast(values, comm().size()); }) == root_error);
  CHECK_THROWS_WITH(comm().broadcast_bytes({}, -1),
                    "broadcast_bytes: root -1 is not a rank of " + std::to_string(comm().size()));
  // Still in step: a sum works after the errors.
  Tensor ones = Tensor::ones({2});
  comm().sum_in_rank_order(ones);
  CHECK(ones.to_float_vector() == std::vector<float>(2, static_cast<float>(comm().size())));
}

TEST_CASE("collectives: ranks that disagree all throw, naming what differs", "[dist][mpi]") {
  if (comm().size() == 1) return;  // one rank always agrees with itself
  const int me = comm().rank();
  comm().set_step(12);
  Tensor uneven = Tensor::zeros({me == 0 ? 4 : 5});
  CHECK_THROWS_WITH(
      comm().sum_in_rank_order(uneven),
      Catch::Matches("mpi: sum_in_rank_order #[0-9]+ at step 12: the ranks "
                     "disagree on numel \\(4 and 5\\); every rank must pass the same"));
  Tensor mixed = Tensor::zeros({3}, me == 0 ? DType::I32 : DType::F32);
  CHECK_THROWS_WITH(comm().max(mixed),
                    Catch::Contains("the ranks disagree on dtype (F32 and I32)"));
  CHECK_THROWS_WITH(comm().broadcast_bytes({}, me == 0 ? 0 : 1),
                    Catch::Contains("the ranks disagree on root (0 and 1)"));
  const auto other = [&] {
    if (me == 0)
      comm().barrier();
    else
      comm().all_gather_int(1);
  };
  CHECK_THROWS_WITH(other(),
                    Catch::Matches("mpi: collective #[0-9]+ at step 12: the ranks called "
                                   "different collectives \\(all_gather_int and barrier\\)"
                                   "; every rank must call the same ones in the same order"));
  comm().set_step(0);
  CHECK(comm().all_gather_int(me).size() == static_cast<size_t>(comm().size()));
}
