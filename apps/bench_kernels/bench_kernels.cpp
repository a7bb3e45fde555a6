// Kernel micro-benchmarks of the CPU backend: the GEMM against plain Eigen (the FP32 path maps
// tensors straight into Eigen, so the two should run at the same rate), the FP16/BF16 GEMM
// (widen, FP32 product, round once), an im2col convolution of a small-CNN layer shape,
// causal attention's softmax fused and composed, an MLP's c_fc + gelu fused into the GEMM's
// epilogue and composed, dropout's keep decisions one Philox evaluation per element against
// one per four, and the building of one Fashion-MNIST training batch of 512 images (the data
// prefetcher's work per step) on 1, 2 and 4 threads.
//
//   mixprec_bench_kernels --benchmark_filter=1024 --benchmark_repetitions=5
//                         --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <vector>

#include <omp.h>

// GCC 12 reports Eigen's AVX-512 kernels as reading uninitialised vectors (the
// _mm512_undefined_ps placeholders inside its own intrinsics), a known false positive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <Eigen/Core>
#pragma GCC diagnostic pop

#include "apps/bench_kernels/attention_softmax_pass.h"
#include "apps/bench_kernels/linear_gelu_pass.h"
#include "apps/data/image_data.h"
#include "core/backend.h"
#include "core/generator.h"
#include "core/math/dropout.h"
#include "core/ops/ops.h"
#include "core/tensor.h"

namespace {

using namespace mixprec;

// Shown as a rate with an SI prefix: "48.2G/s" is 48.2 GFLOP/s.
void set_flops(benchmark::State& state, double flops_per_iteration) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops_per_iteration, benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
}

void BM_EigenGemm(benchmark::State& state) {
  const Eigen::Index n = state.range(0);
  const Eigen::MatrixXf a = Eigen::MatrixXf::Random(n, n);
  const Eigen::MatrixXf b = Eigen::MatrixXf::Random(n, n);
  Eigen::MatrixXf c(n, n);
  for (auto _ : state) {
    c.noalias() = a * b;
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  set_flops(state, 2.0 * n * n * n);
}

// C (m x n) = op(A) @ op(B) in `dtype` through the CPU backend's GEMM, A stored k x m when
// trans_a and B stored n x k when trans_b.
void run_gemm(benchmark::State& state, DType dtype, int64_t m, int64_t n, int64_t k,
              bool trans_a = false, bool trans_b = false) {
  Generator gen(1);
  const Tensor a = Tensor::uniform(trans_a ? Shape{k, m} : Shape{m, k}, gen, -1.f, 1.f, dtype);
  const Tensor b = Tensor::uniform(trans_b ? Shape{n, k} : Shape{k, n}, gen, -1.f, 1.f, dtype);
  Tensor c = Tensor::empty({m, n}, dtype);
  GemmDesc desc;
  desc.m = m;
  desc.n = n;
  desc.k = k;
  desc.trans_a = trans_a;
  desc.trans_b = trans_b;
  Backend& backend = backend_for(kCPU);
  for (auto _ : state) {
    backend.gemm(desc, a, b, c);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  set_flops(state, 2.0 * m * n * k);
}

void run_square_gemm(benchmark::State& state, DType dtype) {
  const int64_t n = state.range(0);
  run_gemm(state, dtype, n, n, n);
}

void BM_MixprecGemm(benchmark::State& state) { run_square_gemm(state, DType::F32); }
void BM_MixprecGemmF16(benchmark::State& state) { run_square_gemm(state, DType::F16); }
void BM_MixprecGemmBF16(benchmark::State& state) { run_square_gemm(state, DType::BF16); }

// The GPT config's linear-layer products at its batch (32 x 128 tokens, width 128, MLP 512),
// as arguments m, n, k: c_fc's forward (4096, 512, 128), c_proj's forward (4096, 128, 512)
// and the shape of c_fc's weight gradient (512, 128, 4096).
void BM_GptGemm(benchmark::State& state, DType dtype) {
  run_gemm(state, dtype, state.range(0), state.range(1), state.range(2));
}
void gpt_gemm_shapes(benchmark::internal::Benchmark* bench) {
  bench->Args({4096, 512, 128})->Args({4096, 128, 512})->Args({512, 128, 4096});
  bench->UseRealTime()->Unit(benchmark::kMillisecond);
}

// The cnn_fashion config's first linear layer (3136 -> 128) at its batch of 128, as argument
// 0, 1 or 2: the forward x @ W^T (128, 128, 3136), the input gradient dy @ W (128, 3136, 128)
// and the weight gradient dy^T @ x (128, 3136, 128).
void BM_CnnLinear(benchmark::State& state, DType dtype) {
  switch (state.range(0)) {
    case 0: return run_gemm(state, dtype, 128, 128, 3136, false, true);
    case 1: return run_gemm(state, dtype, 128, 3136, 128);
    default: return run_gemm(state, dtype, 128, 3136, 128, true, false);
  }
}
void cnn_linear_passes(benchmark::internal::Benchmark* bench) {
  bench->Arg(0)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
}

// N=32, C=32, 28x28, O=64, 3x3, padding 1: the second layer of a small MNIST-sized CNN.
void BM_Conv2d(benchmark::State& state) {
  const int64_t n = 32, c = 32, hw = 28, o = 64, k = 3;
  Generator gen(2);
  const Tensor x = Tensor::uniform({n, c, hw, hw}, gen, -1.f, 1.f);
  const Tensor w = Tensor::uniform({o, c, k, k}, gen, -0.1f, 0.1f);
  const Tensor bias = Tensor::uniform({o}, gen, -0.1f, 0.1f);
  Conv2dDesc desc;
  desc.pad_h = desc.pad_w = 1;
  Tensor y = Tensor::empty({n, o, hw, hw});
  Backend& backend = backend_for(kCPU);
  for (auto _ : state) {
    backend.conv2d(x, w, &bias, desc, y);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  set_flops(state, 2.0 * n * o * hw * hw * c * k * k);
}

// The cnn_fashion config's convolutions at its batch of 128, as arguments (layer, pass):
// layer 0 is 1 -> 32 channels on 28x28, layer 1 is 32 -> 64 on 14x14 (3x3, padding 1);
// pass 0 is the forward, 1 the gradient of the input, 2 the filter's (with the bias's).
void BM_CnnConv(benchmark::State& state, DType dtype) {
  const bool second = state.range(0) == 1;
  const int64_t n = 128, c = second ? 32 : 1, o = second ? 64 : 32, hw = second ? 14 : 28;
  Generator gen(5);
  const Tensor x = Tensor::uniform({n, c, hw, hw}, gen, -1.f, 1.f, dtype);
  const Tensor w = Tensor::uniform({o, c, 3, 3}, gen, -0.3f, 0.3f, dtype);
  const Tensor bias = Tensor::uniform({o}, gen, -0.1f, 0.1f, dtype);
  const Tensor dy = Tensor::uniform({n, o, hw, hw}, gen, -1.f, 1.f, dtype);
  Tensor y = Tensor::empty({n, o, hw, hw}, dtype), dx = Tensor::empty({n, c, hw, hw}, dtype);
  Tensor dw = Tensor::empty({o, c, 3, 3}, dtype), db = Tensor::empty({o}, dtype);
  Conv2dDesc desc;
  desc.pad_h = desc.pad_w = 1;
  Backend& backend = backend_for(kCPU);
  for (auto _ : state) {
    switch (state.range(1)) {
      case 0: backend.conv2d(x, w, &bias, desc, y); break;
      case 1: backend.conv2d_backward_data(dy, w, desc, dx); break;
      default: backend.conv2d_backward_filter(x, dy, desc, dw, &db); break;
    }
    benchmark::ClobberMemory();
  }
  set_flops(state, 2.0 * n * o * hw * hw * c * 9);
}
void cnn_conv_passes(benchmark::internal::Benchmark* bench) {
  for (int layer : {0, 1})
    for (int pass : {0, 1, 2}) bench->Args({layer, pass});
  bench->UseRealTime()->Unit(benchmark::kMillisecond);
}

// The cnn_fashion config's batch norm (fused with relu, as its builder fuses it) and 2x2 max
// pooling at its batch of 128, as arguments (layer, pass): layer 0 is 32 channels of 28x28,
// layer 1 is 64 of 14x14; pass 0 is batch norm's training forward, 1 its backward, 2 max
// pooling's forward with the argmax that training keeps, 3 its backward.
void BM_CnnNormPool(benchmark::State& state, DType dtype) {
  const bool second = state.range(0) == 1;
  const int64_t n = 128, c = second ? 64 : 32, hw = second ? 14 : 28;
  Generator gen(6);
  const Tensor x = Tensor::uniform({n, c, hw, hw}, gen, -1.f, 1.f, dtype);
  const Tensor dy = Tensor::uniform({n, c, hw, hw}, gen, -1.f, 1.f, dtype);
  const Tensor weight = Tensor::uniform({c}, gen, 0.5f, 1.5f, dtype);
  const Tensor bias = Tensor::uniform({c}, gen, -0.1f, 0.1f, dtype);
  Tensor running_mean = Tensor::zeros({c}), running_var = Tensor::ones({c});
  Tensor save_mean = Tensor::empty({c}), save_invstd = Tensor::empty({c});
  Tensor y = Tensor::empty(x.shape(), dtype), dx = Tensor::empty(x.shape(), dtype);
  Tensor dweight = Tensor::empty({c}, dtype), dbias = Tensor::empty({c}, dtype);
  const Shape pooled{n, c, hw / 2, hw / 2};
  Tensor pool_y = Tensor::empty(pooled, dtype), argmax = Tensor::empty(pooled, DType::I32);
  const Tensor pool_dy = Tensor::uniform(pooled, gen, -1.f, 1.f, dtype);
  const Pool2dDesc pool;
  Backend& backend = backend_for(kCPU);
  backend.batch_norm(x, weight, bias, running_mean, running_var, true, 0.1f, 1e-5f, true, y,
                     save_mean, save_invstd);
  backend.pool2d(pool, x, pool_y, &argmax);
  for (auto _ : state) {
    switch (state.range(1)) {
      case 0:
        backend.batch_norm(x, weight, bias, running_mean, running_var, true, 0.1f, 1e-5f, true, y,
                           save_mean, save_invstd);
        break;
      case 1:
        backend.batch_norm_backward(x, weight, save_mean, save_invstd, dy, true, &bias, dx,
                                    dweight, dbias);
        break;
      case 2: backend.pool2d(pool, x, pool_y, &argmax); break;
      default: backend.pool2d_backward(pool, pool_dy, &argmax, dx); break;
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * x.nbytes());
}
void cnn_norm_pool_passes(benchmark::internal::Benchmark* bench) {
  for (int layer : {0, 1})
    for (int pass : {0, 1, 2, 3}) bench->Args({layer, pass});
  bench->UseRealTime()->Unit(benchmark::kMillisecond);
}

// Causal attention's softmax between its GEMMs (attention_softmax_pass.h), forward and
// backward, on one layer of the CPU GPT config's shape at batch 8 (H 6, T 256, FP16
// operands, attention dropout 0.2), fused or composed.
void BM_AttentionSoftmax(benchmark::State& state, bool fused) {
  const Shape shape{8, 6, 256, 256};
  Generator gen(3);
  bench::AttentionSoftmaxPass pass(Tensor::uniform(shape, gen, -4.f, 4.f),
                                   Tensor::uniform(shape, gen, -1.f, 1.f), DType::F16, 0.2f,
                                   PhiloxKey{7, 0});
  Backend& backend = backend_for(kCPU);
  for (auto _ : state) {
    pass.run(backend, fused);
    benchmark::DoNotOptimize(pass.ds.data());
    benchmark::ClobberMemory();
  }
}

// An MLP c_fc + gelu of the CPU GPT config's width (128 -> 512) on 2048 rows, FP16, no bias,
// forward and backward, fused (linear_gelu) or composed (gelu(linear)).
void BM_LinearGelu(benchmark::State& state, bool fused) {
  Generator gen(4);
  bench::LinearGeluPass pass(Tensor::uniform({2048, 128}, gen, -1.f, 1.f, DType::F16),
                             Tensor::uniform({512, 128}, gen, -0.1f, 0.1f, DType::F16),
                             Tensor::uniform({2048, 512}, gen, -1.f, 1.f, DType::F16));
  for (auto _ : state) {
    pass.run(fused);
    benchmark::ClobberMemory();
  }
}

// Dropout's keep decisions for 1M consecutive elements (core/math/dropout.h): one Philox
// evaluation per element through dropout_keep, as a loop visiting elements one at a time
// pays, against fill_dropout_keep's one evaluation per block of four.
void BM_DropoutMask(benchmark::State& state, bool blocks) {
  constexpr int64_t kElements = int64_t{1} << 20;
  std::vector<uint8_t> keep(static_cast<size_t>(kElements));
  const PhiloxKey key{11, 0};
  for (auto _ : state) {
    if (blocks) {
      fill_dropout_keep(key, 0, kElements, 0.2f, keep.data());
    } else {
      for (int64_t i = 0; i < kElements; ++i)
        keep[static_cast<size_t>(i)] = dropout_keep(key, static_cast<uint64_t>(i), 0.2f);
    }
    benchmark::DoNotOptimize(keep.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kElements);
}

// One training batch of 512 Fashion-MNIST images (Debian's dataset-fashion-mnist, the main
// job's data) built on state.range(0) threads: ImageData::make_batch, the data prefetcher's
// work per CNN step. MIXPREC_BENCH_IMAGES and MIXPREC_BENCH_LABELS, when set, name another
// IDX pair (as both splits; e.g. MNIST's test set). Skipped when there is no data.
void BM_ImageBatch(benchmark::State& state) {
  const std::string folder = "/usr/share/datasets/fashion-mnist/";
  const char* images = std::getenv("MIXPREC_BENCH_IMAGES");
  const char* labels = std::getenv("MIXPREC_BENCH_LABELS");
  ImageDataOptions options;
  if (images != nullptr && labels != nullptr && *images != '\0' && *labels != '\0') {
    options.train_images = options.test_images = images;
    options.train_labels = options.test_labels = labels;
  } else {
    options.train_images = folder + "train-images-idx3-ubyte.gz";
    options.train_labels = folder + "train-labels-idx1-ubyte.gz";
    options.test_images = folder + "t10k-images-idx3-ubyte.gz";
    options.test_labels = folder + "t10k-labels-idx1-ubyte.gz";
  }
  if (!std::filesystem::exists(options.train_images)) {
    state.SkipWithError("no image data: install Fashion-MNIST (scripts/setup.sh) or set "
                        "MIXPREC_BENCH_IMAGES and MIXPREC_BENCH_LABELS");
    return;
  }
  options.mean = 0.2860;
  options.std = 0.3530;
  options.batch_size = 512;
  const std::unique_ptr<BatchSource> data = load_image_data(options);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(static_cast<int>(state.range(0)));
  int64_t number = 0;
  for (auto _ : state) {
    Batch batch = data->train_batch(number++ % data->batches_per_epoch());
    benchmark::DoNotOptimize(batch.inputs.data());
  }
  omp_set_num_threads(threads);
  state.SetItemsProcessed(state.iterations() * options.batch_size);
}

}  // namespace

BENCHMARK(BM_ImageBatch)->Arg(1)->Arg(2)->Arg(4)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_DropoutMask, per_element, false)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_DropoutMask, blocks_of_four, true)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_AttentionSoftmax, fused, true)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_AttentionSoftmax, composed, false)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_LinearGelu, fused, true)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_LinearGelu, composed, false)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EigenGemm)
    ->Arg(256)
    ->Arg(512)
    ->Arg(1024)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MixprecGemm)
    ->Arg(256)
    ->Arg(512)
    ->Arg(1024)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MixprecGemmF16)->Arg(1024)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MixprecGemmBF16)->Arg(1024)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_GptGemm, f32, DType::F32)->Apply(gpt_gemm_shapes);
BENCHMARK_CAPTURE(BM_GptGemm, f16, DType::F16)->Apply(gpt_gemm_shapes);
BENCHMARK_CAPTURE(BM_GptGemm, bf16, DType::BF16)->Apply(gpt_gemm_shapes);
BENCHMARK(BM_Conv2d)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CnnLinear, f32, DType::F32)->Apply(cnn_linear_passes);
BENCHMARK_CAPTURE(BM_CnnLinear, f16, DType::F16)->Apply(cnn_linear_passes);
BENCHMARK_CAPTURE(BM_CnnLinear, bf16, DType::BF16)->Apply(cnn_linear_passes);
BENCHMARK_CAPTURE(BM_CnnConv, f32, DType::F32)->Apply(cnn_conv_passes);
BENCHMARK_CAPTURE(BM_CnnConv, f16, DType::F16)->Apply(cnn_conv_passes);
BENCHMARK_CAPTURE(BM_CnnConv, bf16, DType::BF16)->Apply(cnn_conv_passes);
BENCHMARK_CAPTURE(BM_CnnNormPool, f32, DType::F32)->Apply(cnn_norm_pool_passes);
BENCHMARK_CAPTURE(BM_CnnNormPool, f16, DType::F16)->Apply(cnn_norm_pool_passes);
BENCHMARK_CAPTURE(BM_CnnNormPool, bf16, DType::BF16)->Apply(cnn_norm_pool_passes);

BENCHMARK_MAIN();
