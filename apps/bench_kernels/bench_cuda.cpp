// Kernel micro-benchmarks of the CUDA backend, compiled only with MIXPREC_WITH_CUDA:
// - the cuBLASLt GEMM at 4096^3 for FP16, BF16, FP32 with TF32 off (full FP32) and FP32 with
//   TF32 on, as TFLOP/s (the H200's dense FP16/BF16 tensor-core peak is ~989 TFLOP/s);
// - one elementwise op (a + b) over ~25M elements, as GB/s of memory traffic;
// - the multi-tensor unscale_and_check over ~25M gradient elements in 100 tensors, as GB/s.
//
// Every figure is device time: cudaEvents recorded on the backend's stream around each call
// (manual time), so host launch overhead and the per-iteration wait do not count. The rates
// are computed here from the summed event time rather than by Google Benchmark, so they mean
// the same thing in every version of the library. Without a device each benchmark reports
// "no CUDA device" and is skipped.
//
//   mixprec_bench_kernels --benchmark_filter=Cuda --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <exception>
#include <vector>

#include "core/backend.h"
#include "core/generator.h"
#include "core/math_mode.h"
#include "core/tensor.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "cuda/device_query.h"
#include "cuda/register.h"

namespace {

using namespace mixprec;

// The registered CUDA backend. The benchmarks need its stream to record events on, which
// core/backend.h does not expose, hence the concrete type. Null (and the benchmark skipped)
// when there is no device.
CudaBackend* cuda_backend_or_skip(benchmark::State& state) {
  if (cuda_device_count() == 0 || !register_cuda_backend()) {
    state.SkipWithError("no CUDA device");
    return nullptr;
  }
  return dynamic_cast<CudaBackend*>(&backend_for(cuda_device(0)));
}

// A CUDA event, destroyed with its scope (also when a benchmark throws).
class Event {
 public:
  Event() { CUDA_CHECK(cudaEventCreate(&event_)); }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// Times `body` on the backend's stream, one call per benchmark iteration, and returns the
// summed device time in seconds.
template <class Body>
double run_timed(benchmark::State& state, CudaBackend& backend, Body body) {
  const Event start;
  const Event stop;
  // Warm-up outside the timing: cuBLASLt picks its algorithm and the allocator caches the
  // workspace on the first call.
  body(0);
  backend.synchronize();
  double total_seconds = 0.0;
  int64_t iteration = 1;
  for (auto _ : state) {
    CUDA_CHECK(cudaEventRecord(start.get(), backend.stream()));
    body(iteration++);
    CUDA_CHECK(cudaEventRecord(stop.get(), backend.stream()));
    CUDA_CHECK(cudaEventSynchronize(stop.get()));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    state.SetIterationTime(ms * 1e-3);
    total_seconds += ms * 1e-3;
  }
  return total_seconds;
}

// A rate in units of `per` (1e12 for TFLOP/s, 1e9 for GB/s) from work per call and the
// summed device time.
void set_rate(benchmark::State& state, const char* name, double work_per_call, double seconds,
              double per) {
  if (seconds <= 0.0 || state.iterations() == 0) return;
  state.counters[name] =
      benchmark::Counter(work_per_call * static_cast<double>(state.iterations()) / seconds / per);
}

// Runs one benchmark's body; a failure (a CUDA error thrown as mixprec::Error) is reported
// as that benchmark's error instead of ending the whole program.
template <class Body>
void guarded(benchmark::State& state, Body body) {
  try {
    body();
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// Restores the process-wide TF32 switch when the benchmark ends.
class Tf32Scope {
 public:
  explicit Tf32Scope(bool allowed) : previous_(tf32_allowed()) { set_tf32_allowed(allowed); }
  ~Tf32Scope() { set_tf32_allowed(previous_); }
  Tf32Scope(const Tf32Scope&) = delete;
  Tf32Scope& operator=(const Tf32Scope&) = delete;

 private:
  bool previous_;
};

void BM_CudaGemm(benchmark::State& state, DType dtype, bool tf32) {
  guarded(state, [&] {
    CudaBackend* backend = cuda_backend_or_skip(state);
    if (backend == nullptr) return;
    const Tf32Scope tf32_scope(tf32);
    const int64_t n = state.range(0);
    Generator gen(1);
    const Tensor a = Tensor::uniform({n, n}, gen, -1.f, 1.f, dtype, cuda_device(0));
    const Tensor b = Tensor::uniform({n, n}, gen, -1.f, 1.f, dtype, cuda_device(0));
    Tensor c = Tensor::empty({n, n}, dtype, cuda_device(0));
    GemmDesc desc;
    desc.m = desc.n = desc.k = n;
    const double seconds =
        run_timed(state, *backend, [&](int64_t) { backend->gemm(desc, a, b, c); });
    set_rate(state, "TFLOP/s", 2.0 * n * n * n, seconds, 1e12);
  });
}

// out = a + b, same shape: two loads and one store per element.
void BM_CudaAdd(benchmark::State& state, DType dtype) {
  guarded(state, [&] {
    CudaBackend* backend = cuda_backend_or_skip(state);
    if (backend == nullptr) return;
    const int64_t n = state.range(0);
    Generator gen(2);
    const Tensor a = Tensor::uniform({n}, gen, -1.f, 1.f, dtype, cuda_device(0));
    const Tensor b = Tensor::uniform({n}, gen, -1.f, 1.f, dtype, cuda_device(0));
    Tensor out = Tensor::empty({n}, dtype, cuda_device(0));
    const double seconds =
        run_timed(state, *backend, [&](int64_t) { backend->binary(BinaryOp::Add, a, b, out); });
    set_rate(state, "GB/s", 3.0 * static_cast<double>(n) * dtype_size(dtype), seconds, 1e9);
  });
}

// One optimizer's worth of gradients: 100 tensors of alternately ~400k and ~100k elements
// (odd counts, so the vector tails run too), 25M in all.
void BM_CudaUnscaleAndCheck(benchmark::State& state, DType dtype) {
  guarded(state, [&] {
    CudaBackend* backend = cuda_backend_or_skip(state);
    if (backend == nullptr) return;
    constexpr int kTensors = 100;
    Generator gen(3);
    std::vector<Tensor> grads;
    int64_t elements = 0;
    for (int i = 0; i < kTensors; ++i) {
      const int64_t numel = i % 2 == 0 ? 400001 : 99999;
      grads.push_back(Tensor::uniform({numel}, gen, -1.f, 1.f, dtype, cuda_device(0)));
      elements += numel;
    }
    Tensor found_inf = Tensor::zeros({1}, DType::F32, cuda_device(0));
    Tensor tensor_flags = Tensor::zeros({kTensors}, DType::I32, cuda_device(0));
    // The scale alternates between 1/2 and 2 so that the values, rewritten in place on every
    // call, stay the same across iterations instead of decaying to zero. Any inv_scale other
    // than 1 loads and stores every element, as an unscale with a real loss scale does.
    const double seconds = run_timed(state, *backend, [&](int64_t iteration) {
      backend->unscale_and_check(grads, iteration % 2 == 0 ? 0.5 : 2.0, found_inf, tensor_flags);
    });
    set_rate(state, "GB/s", 2.0 * static_cast<double>(elements) * dtype_size(dtype), seconds, 1e9);
    state.counters["elements"] = benchmark::Counter(static_cast<double>(elements));
  });
}

}  // namespace

BENCHMARK_CAPTURE(BM_CudaGemm, F16, DType::F16, false)
    ->Arg(4096)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CudaGemm, BF16, DType::BF16, false)
    ->Arg(4096)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CudaGemm, F32, DType::F32, false)
    ->Arg(4096)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CudaGemm, TF32, DType::F32, true)
    ->Arg(4096)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CudaAdd, F16, DType::F16)
    ->Arg(25'000'000)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CudaAdd, F32, DType::F32)
    ->Arg(25'000'000)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CudaUnscaleAndCheck, F16, DType::F16)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_CudaUnscaleAndCheck, F32, DType::F32)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
