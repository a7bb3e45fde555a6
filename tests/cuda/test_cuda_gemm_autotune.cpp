// The GEMM autotuner (cuda/gemm_autotune.h): its switch and environment variable, the choice
// among timed candidates with fake launches, and tuned GEMMs through the backend against the
// CPU and against the heuristic's plan. On the emulated backend every algorithm computes the
// same sum, so tuned and untuned results agree bit for bit there; on a GPU the algorithms may
// sum in different orders, and they agree within the accumulation tolerance.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backend_agreement.h"
#include "cuda_backend_access.h"
#include "environment_scope.h"
#include "gemm_magnitude.h"
#include "core/error.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "cuda/gemm_autotune.h"
#include "tests/error_message.h"

namespace {

using namespace mixprec;
using namespace mixprec::cuda_test;

using mixprec_test::error_message;

// MIXPREC_GEMM_AUTOTUNE set (or with null, unset) for one scope.
class GemmEnvironment : public EnvironmentScope {
 public:
  explicit GemmEnvironment(const char* value) : EnvironmentScope("MIXPREC_GEMM_AUTOTUNE", value) {}
};

// One GEMM of the end-to-end test: dtypes, shape, flags, batch layout, alpha and beta. Every
// case is a problem no other test tunes.
struct TunedCase {
  DType ab, c;
  int64_t m, n, k;
  bool trans_a = false, trans_b = false;
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
  float alpha = 1.0f, beta = 0.0f;
};

}  // namespace

TEST_CASE("gemm autotune switch follows MIXPREC_GEMM_AUTOTUNE and set_gemm_autotune", "[cuda]") {
  {
    const GemmEnvironment env("1");
    CHECK(gemm_autotune_from_environment());
  }
  {
    const GemmEnvironment env("0");
    CHECK_FALSE(gemm_autotune_from_environment());
  }
  {
    const GemmEnvironment env(nullptr);
    CHECK_FALSE(gemm_autotune_from_environment());
  }
  for (const char* bad : {"yes", "", "2", " 1", "true"}) {
    INFO("MIXPREC_GEMM_AUTOTUNE=\"" << bad << "\"");
    const GemmEnvironment env(bad);
    const std::string message = error_message([] { gemm_autotune_from_environment(); });
    CHECK_THAT(message, Catch::Contains("MIXPREC_GEMM_AUTOTUNE=\"" + std::string(bad) + "\""));
    CHECK_THAT(message, Catch::Contains("use 1"));
  }

  // Once set, the switch no longer reads the environment, not even a bad value.
  const GemmAutotuneScope on(true);
  const GemmEnvironment env("maybe");
  CHECK(gemm_autotune_enabled());
  set_gemm_autotune(false);
  CHECK_FALSE(gemm_autotune_enabled());
}

TEST_CASE("gemm autotune picks the fastest median, skips failed launches, falls back to the first",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  CudaBackend& backend = cuda_backend();
  backend.synchronize();
  using std::chrono::milliseconds;

  // A slow candidate's "work" is a host function on the stream that sleeps: the stream holds
  // its later work, the end event included, until it returns, so the pause lies between the
  // candidate's two events however the driver submits them. The 25 ms pauses are orders of
  // magnitude above the empty calls' timing noise, so the ranking cannot flip on a busy
  // machine; nothing here asserts a duration.
  const auto pause_stream = [&] {
    CUDA_CHECK(cudaLaunchHostFunc(
        backend.stream(), [](void*) { std::this_thread::sleep_for(milliseconds(25)); },
        nullptr));
  };
  std::vector<int> launches;
  std::vector<bool> workspace_given;
  GemmTuning tuning;
  // 0 and 2: slow; 1: fast; 3: fast but its second call fails; 4: its first call fails.
  tuning.workspace_bytes = {0, 1024, 0, 4096, 0};
  tuning.output_bytes = 4096;
  launches.assign(tuning.workspace_bytes.size(), 0);
  workspace_given.assign(tuning.workspace_bytes.size(), false);
  void* first_output = nullptr;
  bool same_output = true;
  tuning.launch = [&](size_t i, void* output, void* workspace) {
    ++launches[i];
    if (first_output == nullptr) first_output = output;
    same_output = same_output && output != nullptr && output == first_output;
    workspace_given[i] = workspace != nullptr;
    if (i == 4 || (i == 3 && launches[i] == 2)) return false;
    if (i == 0 || i == 2) pause_stream();
    return true;
  };
  tuning.problem = "the picking test's problem";
  tuning.name = [](size_t i) { return "option " + std::to_string(i); };
  const uint64_t timed_before = gemm_autotune_candidates_timed();
  const size_t log_before = autotune_log().size();
  CHECK(pick_fastest_gemm_candidate(tuning, backend.stream(), backend.allocator()) == 1);
  // The tuning log gains the problem with each candidate's median, the failed ones marked
  // and the fastest chosen.
  const std::string logged = autotune_log().substr(log_before);
  INFO(logged);
  const std::vector<std::string> lines = lines_of(logged);
  REQUIRE(lines.size() == 6);
  CHECK(lines[0] == "the picking test's problem");
  for (const int i : {0, 1, 2}) {
    CHECK(lines[i + 1].rfind("  option " + std::to_string(i) + "  median ", 0) == 0);
    CHECK(lines[i + 1].find(" us") != std::string::npos);
    CHECK((lines[i + 1].find("(chosen)") != std::string::npos) == (i == 1));
  }
  CHECK(lines[4] == "  option 3  failed");
  CHECK(lines[5] == "  option 4  failed");
  // One untimed and three timed calls each; a failed launch ends its candidate's calls.
  CHECK(launches == std::vector<int>{4, 4, 4, 2, 1});
  CHECK(gemm_autotune_candidates_timed() - timed_before == 3);
  CHECK(same_output);
  CHECK(workspace_given == std::vector<bool>{false, true, false, true, false});

  // Every launch fails: the heuristic's first, nothing timed.
  GemmTuning failing;
  failing.workspace_bytes = {0, 0, 0};
  failing.output_bytes = 512;
  int failed_launches = 0;
  failing.launch = [&](size_t, void*, void*) {
    ++failed_launches;
    return false;
  };
  const size_t log_before_failing = autotune_log().size();
  CHECK(pick_fastest_gemm_candidate(failing, backend.stream(), backend.allocator()) == 0);
  CHECK(failed_launches == 3);
  CHECK(autotune_log().size() == log_before_failing);  // nothing timed, nothing logged
  CHECK(gemm_autotune_candidates_timed() - timed_before == 3);

  // One candidate: nothing to choose between, nothing launched.
  GemmTuning single;
  single.workspace_bytes = {0};
  single.output_bytes = 512;
  single.launch = [&](size_t, void*, void*) {
    FAIL("a single candidate was launched");
    return true;
  };
  CHECK(pick_fastest_gemm_candidate(single, backend.stream(), backend.allocator()) == 0);
  CHECK(gemm_autotune_candidates_timed() - timed_before == 3);
}

TEST_CASE("cuda gemm with autotune on matches the CPU and the untuned gemm, C's content kept",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(71);
  const TunedCase cases[] = {
      {.ab = DType::F16, .c = DType::F16, .m = 53, .n = 41, .k = 37},
      {.ab = DType::F16, .c = DType::F32, .m = 31, .n = 59, .k = 43, .trans_a = true,
       .alpha = -0.75f, .beta = 1.5f},
      {.ab = DType::BF16, .c = DType::BF16, .m = 47, .n = 35, .k = 29, .trans_b = true,
       .alpha = 1.25f, .beta = -0.5f},
      {.ab = DType::BF16, .c = DType::F32, .m = 23, .n = 61, .k = 53, .trans_a = true,
       .trans_b = true},
      {.ab = DType::F32, .c = DType::F32, .m = 43, .n = 27, .k = 67, .beta = 0.25f},
      // A batch with gaps between C's matrices, which keep their poison.
      {.ab = DType::F16, .c = DType::F16, .m = 13, .n = 11, .k = 19, .batch = 3,
       .stride_a = 13 * 19, .stride_b = 19 * 11, .stride_c = 13 * 11 + 5, .alpha = 0.5f,
       .beta = 2.0f},
  };
  for (const TunedCase& t : cases) {
    GemmDesc d;
    d.trans_a = t.trans_a;
    d.trans_b = t.trans_b;
    d.m = t.m;
    d.n = t.n;
    d.k = t.k;
    d.batch = t.batch;
    d.stride_a = t.stride_a;
    d.stride_b = t.stride_b;
    d.stride_c = t.stride_c;
    d.alpha = t.alpha;
    d.beta = t.beta;
    INFO(t.ab << " -> " << t.c << ", " << t.m << "x" << t.n << "x" << t.k << ", batch "
              << t.batch << ", trans " << t.trans_a << t.trans_b << ", alpha " << t.alpha
              << ", beta " << t.beta);
    const int64_t a_numel = (t.batch - 1) * t.stride_a + t.m * t.k;
    const int64_t b_numel = (t.batch - 1) * t.stride_b + t.k * t.n;
    const int64_t c_numel = (t.batch - 1) * t.stride_c + t.m * t.n;
    const Shape a_shape = t.batch > 1 ? Shape{a_numel} : (t.trans_a ? Shape{t.k, t.m} : Shape{t.m, t.k});
    const Shape b_shape = t.batch > 1 ? Shape{b_numel} : (t.trans_b ? Shape{t.n, t.k} : Shape{t.k, t.n});
    const Shape c_shape = t.batch > 1 ? Shape{c_numel} : Shape{t.m, t.n};
    const Tensor a = random_tensor(a_shape, t.ab, rng);
    const Tensor b = random_tensor(b_shape, t.ab, rng);
    // C's prior content: poison where a GEMM must neither read nor write it (all of C when
    // beta == 0, the gaps of a batch), random values elsewhere.
    Tensor c0 = random_tensor(c_shape, t.c, rng);
    {
      std::vector<float> v = c0.to_float_vector();
      for (int64_t i = 0; i < c_numel; ++i) {
        const bool in_matrix = i % (t.batch > 1 ? t.stride_c : c_numel) < t.m * t.n;
        if (t.beta == 0.0f || !in_matrix) v[static_cast<size_t>(i)] = std::nanf("");
      }
      c0 = Tensor::from_vector(v, c_shape, t.c);
    }

    Tensor expected = c0.clone();
    cpu_backend().gemm(d, a, b, expected);
    const Tensor a_gpu = a.to(gpu()), b_gpu = b.to(gpu());

    Tensor untuned = c0.to(gpu());
    {
      const GemmAutotuneScope off(false);
      const uint64_t before = gemm_autotune_candidates_timed();
      gpu_backend().gemm(d, a_gpu, b_gpu, untuned);
      CHECK(gemm_autotune_candidates_timed() == before);
    }

    const GemmAutotuneScope on(true);
    Tensor tuned = c0.to(gpu());
    const uint64_t before = gemm_autotune_candidates_timed();
    gpu_backend().gemm(d, a_gpu, b_gpu, tuned);
    const uint64_t timed = gemm_autotune_candidates_timed() - before;
#if MIXPREC_CUDA_EMULATION
    CHECK(timed == 3);  // every algorithm the emulated heuristic offers
#else
    // A real heuristic may offer a single valid algorithm for a small odd shape; then there
    // is nothing to time. More than one, and every one is timed.
    CHECK((timed == 0 || timed > 1));
#endif
    // The same problem again: the tuned plan, no more timing.
    Tensor again = c0.to(gpu());
    gpu_backend().gemm(d, a_gpu, b_gpu, again);
    CHECK(gemm_autotune_candidates_timed() - before == timed);

    const Tolerance tol = accumulation_tolerance(t.c, t.k);
    const std::vector<float> magnitude = gemm_magnitude(d, a, b, c0);
    expect_close(expected, tuned, tol, magnitude);
    expect_bits_equal(tuned, again);
#if MIXPREC_CUDA_EMULATION
    expect_bits_equal(untuned, tuned);
#else
    expect_close(untuned, tuned, tol, magnitude);
#endif
  }
}
