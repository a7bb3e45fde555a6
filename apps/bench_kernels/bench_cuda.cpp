// Kernel micro-benchmarks of the CUDA backend, compiled only with MIXPREC_WITH_CUDA:
// - the cuBLASLt GEMM at 4096^3 for FP16, BF16, FP32 with TF32 off (full FP32) and FP32 with
//   TF32 on, as TFLOP/s (the H200's dense FP16/BF16 tensor-core peak is ~989 TFLOP/s);
// - the same GEMM for FP16 and BF16 with cuBLASLt's algorithm autotuned (BM_CudaGemmTuned,
//   cuda/gemm_autotune.h), beside the heuristic's first choice;
// - one elementwise op (a + b) over ~25M elements, as GB/s of memory traffic;
// - the multi-tensor unscale_and_check over ~25M gradient elements in 100 tensors, as GB/s;
// - the whole mixed-precision tail of a deferred training step on the GPU GPT's parameters
//   (unscale and check, clip, AdamW with FP16 working copies, the step count, the scale
//   update), as microseconds per step: what issue 5 wants to be at most 5% of the step;
// - causal attention's softmax between its GEMMs on one GPT layer, fused and composed.
//
// Every figure is device time per call with the device kept busy, as in a training step
// (run_timed): cudaEvents recorded on the backend's stream between calls queued back to back
// (manual time), so neither the host's launch latency nor the wait at the end of each
// benchmark iteration counts. The rates are computed here from the summed event time rather
// than by Google Benchmark, so they mean the same thing in every version of the library.
// Without a device each benchmark reports "no CUDA device" and is skipped.
//
//   mixprec_bench_kernels --benchmark_filter=Cuda --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <vector>

#include "apps/bench_kernels/attention_softmax_pass.h"
#include "apps/bench_kernels/linear_gelu_pass.h"
#include "core/backend.h"
#include "core/generator.h"
#include "core/math_mode.h"
#include "core/tensor.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_event.h"
#include "cuda/device_query.h"
#include "cuda/gemm_autotune.h"
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

// Calls of the body queued per benchmark iteration; all but the first are timed.
constexpr int kQueuedCalls = 5;

// Times `body` on the backend's stream and returns the summed device time of one call per
// benchmark iteration, in seconds. Each iteration queues kQueuedCalls calls back to back and
// times from the end of the first to the end of the last, reporting their mean: the stream
// is idle when an iteration starts (its end was waited for), so a start event recorded then
// would also count the time the host takes to launch the call (microseconds, against a
// 4096^3 FP16 GEMM's ~0.2 ms), while the later calls find the device busy with the one
// before, as in a training step, as long as the host queues a call faster than the device
// runs one (true of every benchmark here). torch_gemm.py also queues its calls back to back,
// timing each with its own pair of events and taking the median. An iteration runs five
// calls but reports one call's time, so a run lasts about five times --benchmark_min_time.
template <class Body>
double run_timed(benchmark::State& state, CudaBackend& backend, Body body) {
  const CudaEvent start;
  const CudaEvent stop;
  // Warm-up outside the timing: cuBLASLt picks its algorithm and the allocator caches the
  // workspace on the first call.
  body(0);
  backend.synchronize();
  double total_seconds = 0.0;
  int64_t call = 1;
  for (auto _ : state) {
    body(call++);
    CUDA_CHECK(cudaEventRecord(start.get(), backend.stream()));
    for (int k = 1; k < kQueuedCalls; ++k) body(call++);
    CUDA_CHECK(cudaEventRecord(stop.get(), backend.stream()));
    CUDA_CHECK(cudaEventSynchronize(stop.get()));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    const double seconds = ms * 1e-3 / (kQueuedCalls - 1);
    state.SetIterationTime(seconds);
    total_seconds += seconds;
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

// C = A @ B, n x n x n, inputs uniform in [-1, 1). With `tuned`, the autotune switch is on for
// the benchmark's duration: the warm-up call then times the candidates (outside the timing)
// and every timed call runs the fastest; without it, the switch is off, whatever the
// environment says, so the two rows always compare the heuristic with the tuner.
void BM_CudaGemm(benchmark::State& state, DType dtype, bool tf32, bool tuned) {
  guarded(state, [&] {
    CudaBackend* backend = cuda_backend_or_skip(state);
    if (backend == nullptr) return;
    const Tf32Scope tf32_scope(tf32);
    const GemmAutotuneScope autotune_scope(tuned);
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

// BM_CudaGemm with the autotune switch on.
void BM_CudaGemmTuned(benchmark::State& state, DType dtype, bool tf32) {
  BM_CudaGemm(state, dtype, tf32, true);
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

// The parameter shapes of configs/gpt_shakespeare_gpu.yaml (nanoGPT without biases: 6
// layers, 384 wide, block 256, 65 characters): 10.75M parameters in 39 tensors.
std::vector<Shape> gpt_parameter_shapes() {
  constexpr int64_t C = 384, T = 256, V = 65, layers = 6;
  std::vector<Shape> shapes{{V, C}, {T, C}};
  for (int64_t l = 0; l < layers; ++l) {
    for (const Shape& s : {Shape{C}, Shape{3 * C, C}, Shape{C, C}, Shape{C}, Shape{4 * C, C},
                           Shape{C, 4 * C}})
      shapes.push_back(s);
  }
  shapes.push_back({C});
  return shapes;
}

// Everything a deferred FP16 step does after backward (amp/deferred_steps.h, as `mixprec
// train` runs it on a GPU): the unscale and check by the device's scale, the squared norms
// and the clip, the AdamW update of every tensor in one call (each picking its rates from
// the table), the count of taken steps and the scale update. The count is reset first, as a
// resolve does, so every update runs rather than finding its table exhausted.
void BM_CudaAmpStep(benchmark::State& state) {
  guarded(state, [&] {
    CudaBackend* backend = cuda_backend_or_skip(state);
    if (backend == nullptr) return;
    const Device device = cuda_device(0);
    Generator gen(4);
    std::vector<Tensor> masters, grads, working, exp_avg, exp_avg_sq;
    int64_t elements = 0;
    for (const Shape& shape : gpt_parameter_shapes()) {
      masters.push_back(Tensor::uniform(shape, gen, -1.f, 1.f, DType::F32, device));
      grads.push_back(Tensor::uniform(shape, gen, -1.f, 1.f, DType::F32, device));
      working.push_back(masters.back().to(DType::F16));
      exp_avg.push_back(Tensor::zeros(shape, DType::F32, device));
      exp_avg_sq.push_back(Tensor::zeros(shape, DType::F32, device));
      elements += masters.back().numel();
    }
    const auto tensors = static_cast<int64_t>(grads.size());
    Tensor found_inf = Tensor::zeros({1}, DType::F32, device);
    Tensor flags = Tensor::zeros({tensors}, DType::I32, device);
    Tensor sums = Tensor::zeros({tensors}, DType::F32, device);
    Tensor norm = Tensor::zeros({1}, DType::F32, device);
    Tensor taken = Tensor::zeros({1}, DType::I32, device);
    // A scale of 1 keeps the gradients' values across iterations (the pass still reads and
    // checks every element; a real scale would also write them back).
    DynamicScaleState scale_state;
    scale_state.scale = 1.0;
    std::vector<int32_t> words(kDynamicScaleStateWords);
    std::memcpy(words.data(), &scale_state, sizeof scale_state);
    Tensor state_tensor = Tensor::from_ints(words, {kDynamicScaleStateWords}, device);
    const DynamicScaleRule rule;
    AdamHyper base;
    base.lr = 1e-3f;
    base.beta2 = 0.99f;
    base.weight_decay = 0.1f;
    base.decoupled_weight_decay = true;
    // Ten steps pending: the table a log_every of 10 leads to.
    AdamRateTable table;
    table.count = 10;
    for (int32_t j = 0; j < table.count; ++j) {
      AdamHyper hyper = base;
      hyper.set_step(100 + j);
      table.entry[j] = rates_of(hyper);
    }
    std::vector<AdamParamStep> steps(grads.size());
    for (size_t i = 0; i < grads.size(); ++i)
      steps[i] = {base, &table, &masters[i], &grads[i], &exp_avg[i], &exp_avg_sq[i], &working[i]};
    const double seconds = run_timed(state, *backend, [&](int64_t) {
      backend->fill(taken, 0.0);
      backend->unscale_and_check_on_device(grads, state_tensor, found_inf, flags);
      backend->squared_norms(grads, sums);
      backend->clip_by_total_norm(grads, sums, 1.0, norm);
      backend->adam_steps(steps, &taken, &found_inf);
      backend->count_taken_step(found_inf, taken);
      backend->update_loss_scale(rule, state_tensor, found_inf);
    });
    if (state.iterations() > 0)
      state.counters["us/step"] = benchmark::Counter(seconds * 1e6 / static_cast<double>(state.iterations()));
    state.counters["elements"] = benchmark::Counter(static_cast<double>(elements));
  });
}

// Causal attention's softmax between its GEMMs (attention_softmax_pass.h), forward and
// backward, on one layer of the GPU GPT (B 64, H 6, T 256, FP16 operands, attention dropout
// 0.2), fused or composed. us/layer is one forward plus one backward.
void BM_CudaAttentionSoftmax(benchmark::State& state, bool fused) {
  guarded(state, [&] {
    CudaBackend* backend = cuda_backend_or_skip(state);
    if (backend == nullptr) return;
    const Device device = cuda_device(0);
    const Shape shape{64, 6, 256, 256};
    Generator gen(5);
    bench::AttentionSoftmaxPass pass(Tensor::uniform(shape, gen, -4.f, 4.f, DType::F32, device),
                                     Tensor::uniform(shape, gen, -1.f, 1.f, DType::F32, device),
                                     DType::F16, 0.2f, PhiloxKey{7, 0});
    const double seconds = run_timed(state, *backend, [&](int64_t) { pass.run(*backend, fused); });
    if (state.iterations() > 0) {
      state.counters["us/layer"] =
          benchmark::Counter(seconds * 1e6 / static_cast<double>(state.iterations()));
    }
  });
}

// One layer's MLP c_fc + gelu of the GPU GPT (rows 64 x 256, 384 -> 1536, no bias, FP16),
// forward and backward, fused (cuBLASLt's GELU_AUX epilogue) or composed. us/layer is one
// forward plus one backward.
void BM_CudaLinearGelu(benchmark::State& state, bool fused) {
  guarded(state, [&] {
    CudaBackend* backend = cuda_backend_or_skip(state);
    if (backend == nullptr) return;
    const Device device = cuda_device(0);
    Generator gen(6);
    bench::LinearGeluPass pass(
        Tensor::uniform({16384, 384}, gen, -1.f, 1.f, DType::F16, device),
        Tensor::uniform({1536, 384}, gen, -0.05f, 0.05f, DType::F16, device),
        Tensor::uniform({16384, 1536}, gen, -1.f, 1.f, DType::F16, device));
    const double seconds = run_timed(state, *backend, [&](int64_t) { pass.run(fused); });
    if (state.iterations() > 0) {
      state.counters["us/layer"] =
          benchmark::Counter(seconds * 1e6 / static_cast<double>(state.iterations()));
    }
  });
}

}  // namespace

BENCHMARK_CAPTURE(BM_CudaLinearGelu, fused, true)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CudaLinearGelu, composed, false)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CudaAttentionSoftmax, fused, true)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CudaAttentionSoftmax, composed, false)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CudaGemm, F16, DType::F16, false, false)
    ->Arg(4096)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CudaGemm, BF16, DType::BF16, false, false)
    ->Arg(4096)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CudaGemm, F32, DType::F32, false, false)
    ->Arg(4096)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CudaGemm, TF32, DType::F32, true, false)
    ->Arg(4096)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CudaGemmTuned, F16, DType::F16, false)
    ->Arg(4096)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CudaGemmTuned, BF16, DType::BF16, false)
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
BENCHMARK(BM_CudaAmpStep)->UseManualTime()->Unit(benchmark::kMicrosecond);
