// The CPU emulation of CUDA threads (cuda/emulation/thread_scheduler.h): every thread of the
// grid runs once with its own built-in variables, __syncthreads() orders the writes before
// it against the reads after it, shuffles exchange within one warp only, what a GPU leaves
// undefined is a mixprec::Error naming the block and thread, and a launch with an invalid
// configuration runs nothing and is reported through cudaGetLastError(). The kernels are
// small lambdas written here; every expected value is computed on the host by plain loops.
#include <catch2/catch.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "cuda/emulation/device_emulation.h"
#include "cuda/emulation/runtime_emulation.h"
#include "cuda/emulation/thread_scheduler.h"
#include "tests/error_message.h"

namespace {

using mixprec::emulation::KernelLaunch;
using mixprec::emulation::launch_on_cpu;
using mixprec::emulation::run_grid;
using mixprec_test::error_message;

constexpr unsigned kFullMask = 0xFFFFFFFFu;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

unsigned linear_thread() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

unsigned linear_block() { return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z); }

// The shared-memory tree of block_sum (cuda/kernels/common.cuh) for 256 threads: the result
// is right only if every level's writes are visible to the next level's reads.
float block_sum_256(float value, float* scratch) {
  const unsigned t = threadIdx.x;
  scratch[t] = value;
  __syncthreads();
  for (unsigned width = 128; width > 0; width /= 2) {
    if (t < width) scratch[t] += scratch[t + width];
    __syncthreads();
  }
  return scratch[0];
}

// A launch with a barrier and a warp reduction that must succeed, run after each error to
// show that the scheduler of this OS thread has recovered. Thread t of a 64-thread block
// takes the value of thread 63 - t through shared memory; each warp then sums its lanes.
// normal_launch() makes no Catch assertions, so that another OS thread may call it.
constexpr unsigned kNormalBlocks = 2, kNormalThreads = 64;

std::vector<int> normal_launch() {
  std::vector<int> out(kNormalBlocks * kNormalThreads, -1);
  run_grid(dim3(kNormalBlocks), dim3(kNormalThreads), [&] {
    __shared__ int mirror[kNormalThreads];
    const unsigned t = threadIdx.x;
    mirror[t] = static_cast<int>(blockIdx.x * 1000 + t + 1);
    __syncthreads();
    int v = mirror[kNormalThreads - 1 - t];
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
    out[blockIdx.x * kNormalThreads + t] = v;
  });
  return out;
}

std::vector<int> normal_launch_expected() {
  std::vector<int> expected(kNormalBlocks * kNormalThreads, 0);
  for (unsigned b = 0; b < kNormalBlocks; ++b)
    for (unsigned t = 0; t < kNormalThreads; ++t) {
      const unsigned warp_first = t / 32 * 32;
      for (unsigned lane = warp_first; lane < warp_first + 32; ++lane)
        expected[b * kNormalThreads + t] +=
            static_cast<int>(b * 1000 + (kNormalThreads - 1 - lane) + 1);
    }
  return expected;
}

void check_a_normal_launch_works() { CHECK(normal_launch() == normal_launch_expected()); }

// The thread index x of the "thread (x, 0, 0) of block (...)" that `message` names, or -1.
long named_thread_x(const std::string& message, const std::string& block) {
  std::smatch match;
  const std::regex pattern("thread \\((\\d+), 0, 0\\) of block \\(" + block + "\\)");
  if (!std::regex_search(message, match, pattern)) return -1;
  return std::stol(match[1].str());
}

struct KernelFault {
  unsigned thread;
  unsigned block;
};

}  // namespace

TEST_CASE("emulated launch runs every thread of a 3-D grid of 3-D blocks exactly once",
          "[cuda_emulation]") {
  const dim3 grid(3, 2, 2), block(4, 3, 2);
  struct Visit {
    uint3 thread, block;
    dim3 block_dim, grid_dim;
  };
  std::vector<Visit> visits;
  run_grid(grid, block, [&] { visits.push_back({threadIdx, blockIdx, blockDim, gridDim}); });

  std::set<std::array<unsigned, 6>> expected;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx)
        for (unsigned tz = 0; tz < block.z; ++tz)
          for (unsigned ty = 0; ty < block.y; ++ty)
            for (unsigned tx = 0; tx < block.x; ++tx) expected.insert({bx, by, bz, tx, ty, tz});
  REQUIRE(expected.size() == 12u * 24u);

  std::set<std::array<unsigned, 6>> seen;
  for (const Visit& v : visits) {
    seen.insert({v.block.x, v.block.y, v.block.z, v.thread.x, v.thread.y, v.thread.z});
    CHECK(v.block_dim.x == block.x);
    CHECK(v.block_dim.y == block.y);
    CHECK(v.block_dim.z == block.z);
    CHECK(v.grid_dim.x == grid.x);
    CHECK(v.grid_dim.y == grid.y);
    CHECK(v.grid_dim.z == grid.z);
  }
  CHECK(visits.size() == expected.size());  // no thread ran twice
  CHECK(seen == expected);                  // and every (block, thread) ran
}

TEST_CASE("emulated threads run in ascending order in even blocks and descending in odd ones",
          "[cuda_emulation]") {
  // No barrier: each thread runs to its end before the next starts, in the documented order.
  const dim3 grid(2, 2, 1), block(8, 2, 1);
  std::vector<std::vector<unsigned>> order(4);
  run_grid(grid, block, [&] { order[linear_block()].push_back(linear_thread()); });
  for (unsigned b = 0; b < 4; ++b) {
    std::vector<unsigned> expected(16);
    for (unsigned k = 0; k < 16; ++k) expected[k] = b % 2 == 0 ? k : 15 - k;
    INFO("block " << b);
    CHECK(order[b] == expected);
  }
}

TEST_CASE("emulated __syncthreads makes a shared-memory tree reduction exact", "[cuda_emulation]") {
  constexpr unsigned kBlocks = 3, kThreads = 256;
  // Integers, some negative, whose partial sums stay far below 2^24: exact in float.
  const auto value = [](unsigned b, unsigned t) {
    return static_cast<int>((t * 37 + b * 11) % 1000) - 300;
  };
  std::vector<float> sums(kBlocks, -1.0f);
  std::vector<float> seen_by_all(kBlocks * kThreads, -1.0f);
  run_grid(dim3(kBlocks), dim3(kThreads), [&] {
    __shared__ float scratch[kThreads];
    const float total = block_sum_256(static_cast<float>(value(blockIdx.x, threadIdx.x)), scratch);
    seen_by_all[blockIdx.x * kThreads + threadIdx.x] = total;
    if (threadIdx.x == 0) sums[blockIdx.x] = total;
  });
  for (unsigned b = 0; b < kBlocks; ++b) {
    int64_t expected = 0;
    for (unsigned t = 0; t < kThreads; ++t) expected += value(b, t);
    INFO("block " << b);
    CHECK(static_cast<int64_t>(sums[b]) == expected);
    CHECK(sums[b] == static_cast<float>(expected));
    // After the last barrier every thread reads the same finished sum.
    for (unsigned t = 0; t < kThreads; ++t) CHECK(seen_by_all[b * kThreads + t] == sums[b]);
  }
}

TEST_CASE("emulated __syncthreads orders a reversal through shared memory in even and odd blocks",
          "[cuda_emulation]") {
  constexpr unsigned kBlocks = 2, kThreads = 75;  // not a multiple of 32: barriers do not care
  const auto value = [](unsigned b, unsigned t) { return static_cast<int>(b * 1000 + t + 1); };
  const auto is_reversed = [&](const std::vector<int>& out, unsigned b) {
    for (unsigned t = 0; t < kThreads; ++t)
      if (out[b * kThreads + t] != value(b, kThreads - 1 - t)) return false;
    return true;
  };

  std::vector<int> out(kBlocks * kThreads, 0);
  run_grid(dim3(kBlocks), dim3(kThreads), [&] {
    __shared__ int s[kThreads];
    const unsigned t = threadIdx.x;
    s[t] = value(blockIdx.x, t);
    __syncthreads();
    out[blockIdx.x * kThreads + t] = s[kThreads - 1 - t];
  });
  CHECK(is_reversed(out, 0));  // ascending thread order
  CHECK(is_reversed(out, 1));  // descending thread order

  // Without the barrier a thread reads its mirror before the mirror wrote it in one order or
  // the other: the result is wrong, which shows the threads do not run in lockstep.
  std::vector<int> racy(kBlocks * kThreads, 0);
  run_grid(dim3(kBlocks), dim3(kThreads), [&] {
    __shared__ int s[kThreads];
    const unsigned t = threadIdx.x;
    s[t] = value(blockIdx.x, t);
    racy[blockIdx.x * kThreads + t] = s[kThreads - 1 - t];
  });
  CHECK_FALSE((is_reversed(racy, 0) && is_reversed(racy, 1)));
  // In the ascending block, thread 0 runs first and reads s[74] before thread 74 wrote it; in
  // the descending one, thread 74 runs first and reads s[0] before thread 0 wrote it.
  CHECK(racy[0] != value(0, kThreads - 1));
  CHECK(racy[1 * kThreads + kThreads - 1] != value(1, 0));
}

TEST_CASE("emulated __shfl_xor_sync butterfly gives every lane the warp's sum",
          "[cuda_emulation]") {
  constexpr unsigned kBlocks = 2;
  const auto value = [](unsigned b, unsigned lane) {
    return static_cast<int>(lane * lane + 3 * b + 1);
  };
  std::vector<int> out(kBlocks * 32, -1);
  run_grid(dim3(kBlocks), dim3(32), [&] {
    int v = value(blockIdx.x, threadIdx.x);
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
    out[blockIdx.x * 32 + threadIdx.x] = v;
  });
  for (unsigned b = 0; b < kBlocks; ++b) {
    int expected = 0;
    for (unsigned lane = 0; lane < 32; ++lane) expected += value(b, lane);
    for (unsigned lane = 0; lane < 32; ++lane) {
      INFO("block " << b << " lane " << lane);
      CHECK(out[b * 32 + lane] == expected);
    }
  }
}

TEST_CASE("emulated __shfl_xor_sync moves doubles and 64-bit integers bit for bit",
          "[cuda_emulation]") {
  // Values that use every bit of their width: a double differing from 1 in its last mantissa
  // bits, and 64-bit integers with high bits set and negative values.
  const auto as_double = [](unsigned lane) { return 1.0 + lane * 0x1p-50; };
  const auto as_int64 = [](unsigned lane) {
    return (static_cast<int64_t>(lane) << 40) - 12345 - static_cast<int64_t>(lane);
  };
  std::vector<double> doubles(32, 0.0);
  std::vector<int64_t> ints(32, 0);
  std::vector<float> floats(32, 0.0f);
  run_grid(dim3(1), dim3(32), [&] {
    const unsigned lane = threadIdx.x;
    doubles[lane] = __shfl_xor_sync(kFullMask, as_double(lane), 7);
    ints[lane] = __shfl_xor_sync(kFullMask, as_int64(lane), 19);
    floats[lane] = __shfl_xor_sync(kFullMask, -0.5f * static_cast<float>(lane), 1);
  });
  for (unsigned lane = 0; lane < 32; ++lane) {
    INFO("lane " << lane);
    CHECK(doubles[lane] == as_double(lane ^ 7u));
    CHECK(ints[lane] == as_int64(lane ^ 19u));
    CHECK(floats[lane] == -0.5f * static_cast<float>(lane ^ 1u));
  }
}

TEST_CASE("emulated shuffles of a 256-thread block stay inside each warp", "[cuda_emulation]") {
  constexpr unsigned kThreads = 256;
  const auto value = [](unsigned t) { return static_cast<int>(t / 32 * 1000 + t % 32); };
  std::vector<int> sums(kThreads, -1), partners(kThreads, -1);
  run_grid(dim3(2), dim3(kThreads), [&] {
    const unsigned t = threadIdx.x;
    int v = value(t);
    partners[t] = __shfl_xor_sync(kFullMask, v, 1);
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
    sums[t] = v;  // both blocks write the same values; the second block's order is descending
  });
  for (unsigned t = 0; t < kThreads; ++t) {
    const unsigned first = t / 32 * 32;
    int expected = 0;
    for (unsigned lane = first; lane < first + 32; ++lane) expected += value(lane);
    INFO("thread " << t);
    CHECK(sums[t] == expected);
    CHECK(partners[t] == value(t ^ 1u));
  }
}

TEST_CASE("emulated warps that shuffle different numbers of times synchronise per warp",
          "[cuda_emulation]") {
  constexpr unsigned kThreads = 256, kWarps = kThreads / 32;
  const auto initial = [](unsigned t) { return static_cast<int64_t>(t * 3 + 1); };
  const auto mask_of_round = [](unsigned round) { return 1 << (round % 5); };
  // The host's replay: warp w does w rounds of v[l] += v[l ^ mask].
  std::vector<int64_t> after_loop(kThreads);
  for (unsigned w = 0; w < kWarps; ++w) {
    std::array<int64_t, 32> v{};
    for (unsigned lane = 0; lane < 32; ++lane) v[lane] = initial(w * 32 + lane);
    for (unsigned round = 0; round < w; ++round) {
      std::array<int64_t, 32> next{};
      for (unsigned lane = 0; lane < 32; ++lane)
        next[lane] = v[lane] + v[lane ^ static_cast<unsigned>(mask_of_round(round))];
      v = next;
    }
    for (unsigned lane = 0; lane < 32; ++lane) after_loop[w * 32 + lane] = v[lane];
  }

  SECTION("warps end at different times with no barrier") {
    std::vector<int64_t> out(2 * kThreads, -1);
    run_grid(dim3(2), dim3(kThreads), [&] {
      const unsigned t = threadIdx.x;
      int64_t v = initial(t);
      for (unsigned round = 0; round < t / 32; ++round)
        v += __shfl_xor_sync(kFullMask, v, mask_of_round(round));
      out[blockIdx.x * kThreads + t] = v;
    });
    for (unsigned b = 0; b < 2; ++b)
      for (unsigned t = 0; t < kThreads; ++t) {
        INFO("block " << b << " thread " << t);
        CHECK(out[b * kThreads + t] == after_loop[t]);
      }
  }

  SECTION("early warps wait at a barrier while later ones still shuffle") {
    std::vector<int64_t> out(2 * kThreads, -1), from_next_warp(2 * kThreads, -1);
    run_grid(dim3(2), dim3(kThreads), [&] {
      __shared__ int64_t loop_result[kThreads];
      const unsigned t = threadIdx.x;
      int64_t v = initial(t);
      for (unsigned round = 0; round < t / 32; ++round)
        v += __shfl_xor_sync(kFullMask, v, mask_of_round(round));
      loop_result[t] = v;
      __syncthreads();
      out[blockIdx.x * kThreads + t] = __shfl_xor_sync(kFullMask, v, 16);
      from_next_warp[blockIdx.x * kThreads + t] = loop_result[(t + 32) % kThreads];
    });
    for (unsigned b = 0; b < 2; ++b)
      for (unsigned t = 0; t < kThreads; ++t) {
        INFO("block " << b << " thread " << t);
        CHECK(out[b * kThreads + t] == after_loop[t ^ 16u]);
        CHECK(from_next_warp[b * kThreads + t] == after_loop[(t + 32) % kThreads]);
      }
  }
}

TEST_CASE("emulated __syncthreads inside a branch some threads skip is an error naming the thread",
          "[cuda_emulation]") {
  unsigned block0_threads = 0;
  const std::string message = error_message([&] {
    run_grid(dim3(2), dim3(256), [&] {
      if (blockIdx.x == 0) ++block0_threads;
      if (blockIdx.x == 1 && threadIdx.x < 100) __syncthreads();
    });
  });
  INFO(message);
  CHECK(block0_threads == 256);
  CHECK(contains(message, "__syncthreads()"));
  // The named thread is one that left without reaching the barrier.
  const long x = named_thread_x(message, "1, 0, 0");
  CHECK(x >= 100);
  CHECK(x < 256);
  check_a_normal_launch_works();
}

TEST_CASE("emulated thread returning while its block waits at __syncthreads is an error",
          "[cuda_emulation]") {
  const std::string message = error_message([&] {
    run_grid(dim3(1, 3, 1), dim3(16, 4, 1), [&] {
      if (blockIdx.y == 2 && threadIdx.x == 5 && threadIdx.y == 2) return;
      __syncthreads();
    });
  });
  INFO(message);
  CHECK(contains(message, "thread (5, 2, 0) of block (0, 2, 0)"));
  CHECK(contains(message, "__syncthreads()"));
  check_a_normal_launch_works();
}

TEST_CASE("emulated shuffle in a warp with an exited lane is an error naming the lane",
          "[cuda_emulation]") {
  std::vector<int> sink(64, 0);
  const std::string message = error_message([&] {
    run_grid(dim3(1), dim3(64), [&] {
      if (threadIdx.x == 40) return;
      sink[threadIdx.x] = __shfl_xor_sync(kFullMask, static_cast<int>(threadIdx.x), 1);
    });
  });
  INFO(message);
  CHECK(contains(message, "thread (40, 0, 0) of block (0, 0, 0)"));
  CHECK(contains(message, "warp shuffle"));
  check_a_normal_launch_works();
}

TEST_CASE("emulated exception thrown by one thread leaves run_grid as itself", "[cuda_emulation]") {
  unsigned finished = 0;
  try {
    run_grid(dim3(3), dim3(128), [&] {
      if (blockIdx.x == 2 && threadIdx.x == 77) throw KernelFault{threadIdx.x, blockIdx.x};
      __syncthreads();
      ++finished;
    });
    FAIL("run_grid returned although a thread threw");
  } catch (const KernelFault& fault) {
    CHECK(fault.thread == 77);
    CHECK(fault.block == 2);
  }
  CHECK(finished == 2 * 128);  // the blocks before the faulty one ran to their end
  check_a_normal_launch_works();

  // A mixprec::Error raised inside a kernel (here an unsupported partial-mask shuffle) keeps
  // its message.
  CHECK_THROWS_WITH(run_grid(dim3(1), dim3(32), [] { (void)__shfl_xor_sync(0xFFFFu, 1, 1); }),
                    Catch::Contains("partial mask"));
  check_a_normal_launch_works();
}

TEST_CASE("emulated barriers or shuffles outside a kernel and nested launches are errors",
          "[cuda_emulation]") {
  CHECK_THROWS_WITH(__syncthreads(), Catch::Contains("__syncthreads() called outside a kernel"));
  CHECK_THROWS_WITH(__shfl_xor_sync(kFullMask, 1, 1), Catch::Contains("outside a kernel"));
  CHECK_THROWS_WITH(run_grid(dim3(1), dim3(1), [] { run_grid(dim3(1), dim3(1), [] {}); }),
                    Catch::Contains("a kernel launched a kernel"));
  check_a_normal_launch_works();
  // Also after an error the scheduler knows it is outside a kernel again.
  CHECK_THROWS_WITH(__syncthreads(), Catch::Contains("outside a kernel"));
}

TEST_CASE("emulated launch with an invalid configuration runs nothing and sets the last error",
          "[cuda_emulation]") {
  (void)cudaGetLastError();  // start clean, whatever ran before on this thread
  unsigned runs = 0;
  const auto body = [&] { ++runs; };
  struct Case {
    const char* what;
    dim3 grid, block;
  };
  const Case cases[] = {
      {"block of 0 threads", dim3(1), dim3(0, 1, 1)},
      {"block with y = 0", dim3(1), dim3(32, 0, 1)},
      {"block of 1025 threads", dim3(1), dim3(1025)},
      {"block of 32 x 32 x 2 threads", dim3(1), dim3(32, 32, 2)},
      {"block.z of 65", dim3(1), dim3(1, 1, 65)},
      {"empty grid", dim3(0), dim3(32)},
      {"grid.y of 65536", dim3(1, 65536, 1), dim3(32)},
      {"grid.z of 65536", dim3(1, 1, 65536), dim3(32)},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    launch_on_cpu(c.grid, c.block, body);
    CHECK(runs == 0);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    CHECK(cudaGetLastError() == cudaSuccess);  // reported once
  }

  // The largest valid sizes run every thread and record nothing.
  launch_on_cpu(dim3(1), dim3(1024), body);
  CHECK(runs == 1024);
  runs = 0;
  launch_on_cpu(dim3(1, 65535, 1), dim3(1), body);
  CHECK(runs == 65535);
  CHECK(cudaGetLastError() == cudaSuccess);

  // What MIXPREC_LAUNCH becomes: each thread gets the arguments; a bad block is reported.
  int total = 0;
  const auto kernel = [&](int weight, int64_t offset) {
    total += weight + static_cast<int>(offset);
  };
  KernelLaunch(dim3(1), dim3(1025), nullptr, kernel)(1, int64_t{0});
  CHECK(total == 0);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  KernelLaunch(dim3(2, 1, 1), dim3(3, 2, 1), nullptr, kernel)(5, int64_t{2});
  CHECK(total == 2 * 6 * 7);
  CHECK(cudaGetLastError() == cudaSuccess);

  // run_grid itself refuses with a mixprec::Error naming the configuration.
  CHECK_THROWS_WITH(run_grid(dim3(1), dim3(0, 1, 1), body),
                    Catch::Contains("invalid launch configuration"));
  CHECK(runs == 65535);
}

TEST_CASE("emulated launches on two OS threads are independent", "[cuda_emulation]") {
  // Thread A stops in the middle of its launch (one of its threads waits inside the kernel,
  // between two barriers) while thread B runs whole launches, one of them failing; then A
  // finishes. Each OS thread has its own scheduler, shared memory and last error, so neither
  // sees the other's.
  std::atomic<bool> a_inside{false}, b_done{false};
  (void)cudaGetLastError();
  REQUIRE(cudaSetDevice(1) == cudaErrorInvalidDevice);  // A's own pending error
  std::string b_error;
  cudaError_t b_initial_error = cudaErrorUnknown, b_last_error = cudaSuccess;
  bool b_recovered = false;
  std::thread b([&] {  // no Catch assertions off the main thread: results are checked below
    while (!a_inside.load()) std::this_thread::yield();
    b_initial_error = cudaGetLastError();
    launch_on_cpu(dim3(1), dim3(2048), [] {});  // records an error on B only
    try {
      run_grid(dim3(1), dim3(64), [] {
        if (threadIdx.x == 3) return;
        __syncthreads();
      });
    } catch (const mixprec::Error& e) {
      b_error = e.what();
    }
    b_last_error = cudaGetLastError();
    try {
      b_recovered = normal_launch() == normal_launch_expected();
    } catch (...) {
      b_recovered = false;
    }
    b_done.store(true);
  });
  std::vector<int> sums(4, -1);
  bool a_failed = false;
  try {
    run_grid(dim3(4), dim3(64), [&] {
      __shared__ int s[64];
      const unsigned t = threadIdx.x;
      s[t] = static_cast<int>(blockIdx.x * 64 + t);
      __syncthreads();
      if (blockIdx.x == 1 && t == 5) {
        a_inside.store(true);
        while (!b_done.load()) std::this_thread::yield();
      }
      __syncthreads();
      if (t == 0) {
        int total = 0;
        for (int v : s) total += v;
        sums[blockIdx.x] = total;
      }
    });
  } catch (...) {
    a_failed = true;
    a_inside.store(true);  // let B run, so that it can be joined
  }
  b.join();
  CHECK_FALSE(a_failed);
  INFO(b_error);
  CHECK(contains(b_error, "thread (3, 0, 0) of block (0, 0, 0)"));
  CHECK(b_initial_error == cudaSuccess);
  CHECK(b_last_error == cudaErrorInvalidConfiguration);
  CHECK(b_recovered);
  for (unsigned blk = 0; blk < 4; ++blk) {
    int expected = 0;
    for (unsigned t = 0; t < 64; ++t) expected += static_cast<int>(blk * 64 + t);
    CHECK(sums[blk] == expected);
  }
  CHECK(cudaGetLastError() == cudaErrorInvalidDevice);  // A's error, not B's
  CHECK(cudaGetLastError() == cudaSuccess);
}
