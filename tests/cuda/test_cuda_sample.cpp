// Text generation on cuda:0: GPT's key/value cache stays on the device in the working dtype
// and gives the CPU's logits, and `mixprec sample` writes the CPU's text from one checkpoint.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <sstream>
#include <vector>

#include "apps/sample/sample_command.h"
#include "core/autograd/grad_mode.h"
#include "layers/gpt.h"
#include "layers/model_builder.h"
#include "tests/cuda/backend_agreement.h"
#include "tests/cuda/train_run_support.h"

namespace mixprec {
namespace {

using namespace cuda_train_test;

GptSpec tiny_gpt() {
  GptSpec s;
  s.vocab_size = 13;
  s.block_size = 8;
  s.n_layer = 2;
  s.n_head = 2;
  s.n_embd = 16;
  return s;
}

// The logits of every position of `ids` [1, 8] read one at a time after a prompt of 2.
std::vector<std::vector<float>> cached_logits(GPT& gpt, const std::vector<int32_t>& ids,
                                              Device device, KvCache& cache) {
  NoGradGuard no_grad;
  std::vector<std::vector<float>> rows;
  rows.push_back(gpt.forward_cached(Tensor::from_ints({ids[0], ids[1]}, {1, 2}, device), cache)
                     .to(DType::F32)
                     .to_float_vector());
  for (size_t i = 2; i < ids.size(); ++i)
    rows.push_back(gpt.forward_cached(Tensor::from_ints({ids[i]}, {1, 1}, device), cache)
                       .to(DType::F32)
                       .to_float_vector());
  return rows;
}

}  // namespace

TEST_CASE("cuda: GPT's cache stays on the device in the working dtype with the CPU's logits",
          "[cuda][sample]") {
  MIXPREC_REQUIRE_CUDA();
  const std::vector<int32_t> ids{3, 1, 4, 1, 5, 9, 2, 6};
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    CAPTURE(dtype);
    Generator init_cpu(7), init_gpu(7);
    auto cpu_model = build_gpt(tiny_gpt(), init_cpu, nullptr, kCPU);
    auto gpu_model = build_gpt(tiny_gpt(), init_gpu, nullptr, gpu());
    for (auto* model : {cpu_model.get(), gpu_model.get()}) {
      model->eval();
      for (Parameter p : model->parameters()) p.set_working_dtype(dtype);
    }
    KvCache cpu_cache, gpu_cache;
    const auto want = cached_logits(static_cast<GPT&>(*cpu_model), ids, kCPU, cpu_cache);
    const auto got = cached_logits(static_cast<GPT&>(*gpu_model), ids, gpu(), gpu_cache);
    REQUIRE(gpu_cache.layers.size() == 2);
    CHECK(gpu_cache.length == 8);
    CHECK(gpu_cache.layers[1].keys.device() == gpu());
    CHECK(gpu_cache.layers[1].values.dtype() == dtype);
    CHECK(gpu_cache.layers[1].keys.shape() == Shape{1, 2, 8, 8});
    // The backends sum in other orders: FP32 rounding apart, or a unit in the last place of
    // the 16-bit format where a rounding moves.
    const double bound = dtype == DType::F32 ? 1e-5 : dtype == DType::F16 ? 4.0 / 1024 : 4.0 / 128;
    for (size_t row = 0; row < want.size(); ++row) {
      CAPTURE(row);
      double worst = 0.0, largest = 0.0;
      for (size_t k = 0; k < want[row].size(); ++k) {
        worst = std::max(worst, std::fabs(double(want[row][k]) - got[row][k]));
        largest = std::max(largest, std::fabs(double(want[row][k])));
      }
      CHECK(worst <= bound * largest);
    }
  }
}

TEST_CASE("cuda: mixprec sample writes the CPU's text from the same checkpoint", "[cuda][sample]") {
  MIXPREC_REQUIRE_CUDA();
  const std::vector<std::string> gpt = small_gpt_run_or_warn({"train.steps=3"});
  if (gpt.empty()) return;
  ScratchDir dir("cuda-sample");
  train_into(dir / "run", config_path("gpt_shakespeare.yaml"), gpt);

  SampleOptions options;
  options.config_path = config_path("gpt_shakespeare.yaml");
  options.overrides = gpt;
  options.checkpoint = dir / "run";
  options.tokens = 30;
  auto text_on = [&](const char* device, const char* precision) {
    options.device = device;
    options.precision = precision;
    std::ostringstream out;
    const SampleResult result = run_sampling(options, out);
    CHECK(result.device == (std::string(device) == "cpu" ? "cpu" : "cuda:0"));
    CHECK(out.str() == result.text);
    return result.text;
  };
  CHECK(text_on("cuda", "fp32") == text_on("cpu", "fp32"));
  // 16-bit inference on the device: one seed, one text.
  const std::string half = text_on("cuda", "fp16");
  CHECK(half.size() == 31);
  CHECK(text_on("cuda", "fp16") == half);
}

}  // namespace mixprec
