// The convolution autotuner (cuda/conv_autotune.h): its switch and environment variable, and
// tuned convolutions through the backend against the CPU and against the heuristic's plan.
// The emulated heuristic offers three deterministic forward algorithms, and for each backward
// pass two deterministic ones beside non-deterministic ones, which are never timed unless
// the non-deterministic switch admits them (the last tests). On the emulated backend every
// algorithm computes the same sum, so tuned and untuned results agree bit for bit there; on
// a GPU they agree within the accumulation tolerance.
#include <cstdint>
#include <random>
#include <sstream>
#include <string>

#include "backend_agreement.h"
#include "environment_scope.h"
#include "cuda/conv_autotune.h"
#include "tests/error_message.h"

namespace {

using namespace mixprec;
using namespace mixprec::cuda_test;

using mixprec_test::error_message;

class ConvEnvironment : public EnvironmentScope {
 public:
  explicit ConvEnvironment(const char* value) : EnvironmentScope("MIXPREC_CONV_AUTOTUNE", value) {}
};

// A problem of the end-to-end test; none of them is used by another test, so each plan is
// new here.
struct TunedConv {
  int64_t n, c, h, w, o, kh, kw;
  Conv2dDesc desc;
};

Shape output_of(const TunedConv& s) {
  return {s.n, s.o, (s.h + 2 * s.desc.pad_h - s.kh) / s.desc.stride_h + 1,
          (s.w + 2 * s.desc.pad_w - s.kw) / s.desc.stride_w + 1};
}

// The growth of the counter over one call.
template <class F>
uint64_t timed_by(const F& call) {
  const uint64_t before = conv_autotune_candidates_timed();
  call();
  return conv_autotune_candidates_timed() - before;
}

// How many candidates the first tuned call of a new problem times: every deterministic
// algorithm the emulated heuristic offers; on a GPU none (one candidate) or several.
void check_timed(uint64_t timed, uint64_t emulated) {
#if MIXPREC_CUDA_EMULATION
  CHECK(timed == emulated);
#else
  (void)emulated;
  CHECK((timed == 0 || timed > 1));
#endif
}

void check_tuned_matches_untuned(const Tensor& untuned, const Tensor& tuned, Tolerance tol,
                                 const std::vector<float>& magnitude) {
#if MIXPREC_CUDA_EMULATION
  (void)tol;
  (void)magnitude;
  expect_bits_equal(untuned, tuned);
#else
  expect_close(untuned, tuned, tol, magnitude);
#endif
}

// The CPU's input and weight gradients of one problem, with the magnitudes that scale their
// tolerances.
struct CpuBackward {
  Tensor dx, dx_mag, dw, dw_mag;
};

CpuBackward cpu_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                         const Conv2dDesc& desc) {
  const DType dtype = x.dtype();
  CpuBackward r{Tensor::empty(x.shape(), dtype), Tensor::empty(x.shape(), DType::F32),
                Tensor::empty(w.shape(), dtype), Tensor::empty(w.shape(), DType::F32)};
  cpu_backend().conv2d_backward_data(dy, w, desc, r.dx);
  cpu_backend().conv2d_backward_data(abs_of(dy), abs_of(w), desc, r.dx_mag);
  cpu_backend().conv2d_backward_filter(x, dy, desc, r.dw, nullptr);
  cpu_backend().conv2d_backward_filter(abs_of(x), abs_of(dy), desc, r.dw_mag, nullptr);
  return r;
}

}  // namespace

TEST_CASE("conv autotune switch follows MIXPREC_CONV_AUTOTUNE and set_conv_autotune", "[cuda]") {
  {
    const ConvEnvironment env("1");
    CHECK(conv_autotune_from_environment());
  }
  {
    const ConvEnvironment env("0");
    CHECK_FALSE(conv_autotune_from_environment());
  }
  {
    const ConvEnvironment env(nullptr);
    CHECK_FALSE(conv_autotune_from_environment());
  }
  for (const char* bad : {"on", "", "11", "1 "}) {
    INFO("MIXPREC_CONV_AUTOTUNE=\"" << bad << "\"");
    const ConvEnvironment env(bad);
    const std::string message = error_message([] { conv_autotune_from_environment(); });
    CHECK_THAT(message, Catch::Contains("MIXPREC_CONV_AUTOTUNE=\"" + std::string(bad) + "\""));
    CHECK_THAT(message, Catch::Contains("use 1 (autotune cuDNN convolution algorithms)"));
  }
  // Once set, the switch no longer reads the environment; the GEMM switch is a separate one.
  const ConvAutotuneScope on(true);
  const ConvEnvironment env("maybe");
  CHECK(conv_autotune_enabled());
  {
    const ConvAutotuneScope off(false);
    CHECK_FALSE(conv_autotune_enabled());
  }
  CHECK(conv_autotune_enabled());
}

TEST_CASE("cuda conv2d with autotune on matches the CPU and the heuristic's plan, bias kept, "
          "non-deterministic algorithms never timed", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(83);
  // The dtype index makes each dtype's problem distinct (the dtype is part of the plan key
  // anyway; distinct extents keep the cases apart in failure messages too).
  const TunedConv cases[] = {{3, 5, 13, 11, 7, 3, 3, {1, 1, 1, 1}},
                             {2, 4, 12, 10, 6, 5, 3, {2, 1, 2, 1}}};
  for (const TunedConv& base : cases) {
    for (size_t di = 0; di < 3; ++di) {
      const DType dtype = kFloatingTypes[di];
      TunedConv s = base;
      s.h += static_cast<int64_t>(di);
      std::ostringstream label;
      label << "x [" << s.n << "," << s.c << "," << s.h << "," << s.w << "], w [" << s.o << ","
            << s.c << "," << s.kh << "," << s.kw << "], " << dtype;
      INFO(label.str());
      const Shape xs{s.n, s.c, s.h, s.w}, ws{s.o, s.c, s.kh, s.kw}, ys = output_of(s);
      const Tensor x = random_tensor(xs, dtype, rng), w = random_tensor(ws, dtype, rng);
      const Tensor bias = random_tensor({s.o}, dtype, rng), dy = random_tensor(ys, dtype, rng);
      const Tensor gx = x.to(gpu()), gw = w.to(gpu()), gbias = bias.to(gpu()), gdy = dy.to(gpu());

      // The CPU's results and magnitudes.
      Tensor y_cpu = Tensor::empty(ys, dtype), y_mag = Tensor::empty(ys, DType::F32);
      cpu_backend().conv2d(x, w, &bias, s.desc, y_cpu);
      const Tensor abs_bias = abs_of(bias);
      cpu_backend().conv2d(abs_of(x), abs_of(w), &abs_bias, s.desc, y_mag);
      const CpuBackward cpu = cpu_backward(x, w, dy, s.desc);
      const Tensor &dx_cpu = cpu.dx, &dx_mag = cpu.dx_mag, &dw_cpu = cpu.dw, &dw_mag = cpu.dw_mag;
      const Tolerance y_tol = accumulation_tolerance(dtype, s.c * s.kh * s.kw);
      const Tolerance dx_tol = accumulation_tolerance(dtype, s.o * s.kh * s.kw);
      const Tolerance dw_tol = accumulation_tolerance(dtype, s.n * ys[2] * ys[3]);

      // The heuristic's plans, switch off: nothing timed.
      Tensor y_plain = poisoned(ys, dtype), dx_plain = poisoned(xs, dtype),
             dw_plain = poisoned(ws, dtype);
      {
        const ConvAutotuneScope off(false);
        CHECK(timed_by([&] {
                gpu_backend().conv2d(gx, gw, &gbias, s.desc, y_plain);
                gpu_backend().conv2d_backward_data(gdy, gw, s.desc, dx_plain);
                gpu_backend().conv2d_backward_filter(gx, gdy, s.desc, dw_plain, nullptr);
              }) == 0);
      }

      const ConvAutotuneScope on(true);
      // Forward with bias: y already holds the bias when the convolution runs, and tuning
      // writes elsewhere, so the bias is counted once.
      Tensor y = poisoned(ys, dtype);
      check_timed(timed_by([&] { gpu_backend().conv2d(gx, gw, &gbias, s.desc, y); }), 3);
      expect_close(y_cpu, y, y_tol, y_mag.to_float_vector());
      check_tuned_matches_untuned(y_plain, y, y_tol, y_mag.to_float_vector());

      // Backward: two deterministic candidates each (ALGO_1 and FFT), the non-deterministic
      // ALGO_0 (both passes) and ALGO_3 (filter) left out.
      Tensor dx = poisoned(xs, dtype);
      check_timed(timed_by([&] { gpu_backend().conv2d_backward_data(gdy, gw, s.desc, dx); }), 2);
      expect_close(dx_cpu, dx, dx_tol, dx_mag.to_float_vector());
      check_tuned_matches_untuned(dx_plain, dx, dx_tol, dx_mag.to_float_vector());
      Tensor dw = poisoned(ws, dtype);
      check_timed(
          timed_by([&] { gpu_backend().conv2d_backward_filter(gx, gdy, s.desc, dw, nullptr); }),
          2);
      expect_close(dw_cpu, dw, dw_tol, dw_mag.to_float_vector());
      check_tuned_matches_untuned(dw_plain, dw, dw_tol, dw_mag.to_float_vector());

      // The same problems again: the tuned plans, no more timing, the same bits.
      Tensor y2 = poisoned(ys, dtype), dx2 = poisoned(xs, dtype), dw2 = poisoned(ws, dtype);
      CHECK(timed_by([&] {
              gpu_backend().conv2d(gx, gw, &gbias, s.desc, y2);
              gpu_backend().conv2d_backward_data(gdy, gw, s.desc, dx2);
              gpu_backend().conv2d_backward_filter(gx, gdy, s.desc, dw2, nullptr);
            }) == 0);
      expect_bits_equal(y, y2);
      expect_bits_equal(dx, dx2);
      expect_bits_equal(dw, dw2);
    }
  }
}

TEST_CASE("conv nondeterministic switch follows MIXPREC_CONV_NONDETERMINISTIC", "[cuda]") {
  {
    const EnvironmentScope env("MIXPREC_CONV_NONDETERMINISTIC", "1");
    CHECK(conv_nondeterministic_switch().from_environment());
  }
  {
    const EnvironmentScope env("MIXPREC_CONV_NONDETERMINISTIC", nullptr);
    CHECK_FALSE(conv_nondeterministic_switch().from_environment());
  }
  {
    const EnvironmentScope env("MIXPREC_CONV_NONDETERMINISTIC", "yes");
    const std::string message =
        error_message([] { conv_nondeterministic_switch().from_environment(); });
    CHECK_THAT(message, Catch::Contains("MIXPREC_CONV_NONDETERMINISTIC=\"yes\""));
    CHECK_THAT(message, Catch::Contains("0 / unset (deterministic convolution algorithms only)"));
  }
  // Set, it no longer reads the environment, and it is not the autotune switch.
  const ConvNondeterministicScope on(true);
  const EnvironmentScope env("MIXPREC_CONV_NONDETERMINISTIC", "yes");
  CHECK(conv_nondeterministic_allowed());
  const ConvAutotuneScope tune_off(false);
  CHECK(conv_nondeterministic_allowed());
  {
    const ConvNondeterministicScope off(false);
    CHECK_FALSE(conv_nondeterministic_allowed());
  }
  CHECK(conv_nondeterministic_allowed());
}

TEST_CASE("cuda conv2d with non-deterministic algorithms admitted tunes among them too and "
          "still matches the CPU", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(89);
  const DType dtype = DType::F32;
  // A problem no other test uses, so each pass's plan is new here.
  const TunedConv s{2, 3, 9, 14, 5, 3, 3, {1, 1, 1, 1}};
  const Shape xs{s.n, s.c, s.h, s.w}, ws{s.o, s.c, s.kh, s.kw}, ys = output_of(s);
  const Tensor x = random_tensor(xs, dtype, rng), w = random_tensor(ws, dtype, rng);
  const Tensor dy = random_tensor(ys, dtype, rng);
  const Tensor gx = x.to(gpu()), gw = w.to(gpu()), gdy = dy.to(gpu());
  const CpuBackward cpu = cpu_backward(x, w, dy, s.desc);
  const Tensor &dx_cpu = cpu.dx, &dx_mag = cpu.dx_mag, &dw_cpu = cpu.dw, &dw_mag = cpu.dw_mag;

  const ConvNondeterministicScope admitted(true);
  const ConvAutotuneScope on(true);
  // Backward data: ALGO_1, ALGO_0 and FFT; backward filter: ALGO_1, ALGO_0, ALGO_3 and FFT
  // (two each when only deterministic ones are admitted, as the test above shows).
  Tensor dx = poisoned(xs, dtype);
  check_timed(timed_by([&] { gpu_backend().conv2d_backward_data(gdy, gw, s.desc, dx); }), 3);
  expect_close(dx_cpu, dx, accumulation_tolerance(dtype, s.o * s.kh * s.kw),
               dx_mag.to_float_vector());
  Tensor dw = poisoned(ws, dtype);
  check_timed(
      timed_by([&] { gpu_backend().conv2d_backward_filter(gx, gdy, s.desc, dw, nullptr); }), 4);
  expect_close(dw_cpu, dw, accumulation_tolerance(dtype, s.n * ys[2] * ys[3]),
               dw_mag.to_float_vector());
  // The plans are keyed by the switch: the same problems with it off are tuned again, among
  // the deterministic algorithms only.
  const ConvNondeterministicScope deterministic(false);
  Tensor dw2 = poisoned(ws, dtype);
  check_timed(
      timed_by([&] { gpu_backend().conv2d_backward_filter(gx, gdy, s.desc, dw2, nullptr); }), 2);
  expect_close(dw_cpu, dw2, accumulation_tolerance(dtype, s.n * ys[2] * ys[3]),
               dw_mag.to_float_vector());
}

TEST_CASE("a tuned convolution's candidates and their times go to the tuning log", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  std::mt19937 rng(90);
  // A problem no other test uses, so its plan is new here.
  const TunedConv s{3, 2, 11, 6, 4, 3, 3, {1, 1, 0, 1}};
  const Tensor gx = random_tensor({s.n, s.c, s.h, s.w}, DType::F16, rng).to(gpu());
  const Tensor gdy = random_tensor(output_of(s), DType::F16, rng).to(gpu());
  Tensor dw = poisoned({s.o, s.c, s.kh, s.kw}, DType::F16);
  const ConvNondeterministicScope admitted(true);
  const ConvAutotuneScope on(true);
  const size_t before = autotune_log().size();
  const uint64_t timed =
      timed_by([&] { gpu_backend().conv2d_backward_filter(gx, gdy, s.desc, dw, nullptr); });
  const std::string logged = autotune_log().substr(before);
  INFO(logged);
  const std::vector<std::string> lines = lines_of(logged);
  if (timed == 0) {
    // A cuDNN that offers one algorithm for this problem leaves nothing to time or log (the
    // emulated one offers four, so this is a GPU's case only).
    CHECK(logged.empty());
    check_timed(timed, 4);
    return;
  }
  REQUIRE(lines.size() >= 3);  // the problem and at least two candidates
  CHECK(lines[0] == "cudnnConvolutionBackwardFilter 3x2x11x6 * 4x2x3x3 (stride 1x1, padding 0x1) F16");
  int chosen = 0;
  for (size_t i = 1; i < lines.size(); ++i) {
    CHECK(lines[i].rfind("  ", 0) == 0);
    const bool timed = lines[i].find(" bytes  median ") != std::string::npos;
    const bool failed = lines[i].size() > 14 && lines[i].ends_with(" bytes  failed");
    CHECK((timed || failed));
    chosen += lines[i].find("(chosen)") != std::string::npos;
  }
  CHECK(chosen == 1);
#if MIXPREC_CUDA_EMULATION
  // The emulated ranking, every one admitted: ALGO_1, ALGO_0, ALGO_3 and FFT.
  REQUIRE(lines.size() == 5);
  CHECK(lines[1].rfind("  ALGO_1, tensor op math, workspace 0 bytes", 0) == 0);
  CHECK(lines[2].rfind("  ALGO_0, tensor op math, non-deterministic, workspace 0 bytes", 0) == 0);
  CHECK(lines[3].rfind("  ALGO_3, tensor op math, non-deterministic, workspace 0 bytes", 0) == 0);
  CHECK(lines[4].rfind("  FFT, tensor op math, workspace 2048 bytes", 0) == 0);
#endif
}
