// The prefetcher on cuda:0: its worker scans each batch on the host and uploads inputs and
// targets, so the trainer receives batches already on the device, holding exactly the bytes
// of train_batch(n), with their input_scan set. End to end, a run on cuda:0 waits for the
// device no more often per step than test_cuda_host_reads.cpp allows, and an injection into
// the input is still reported at element 0.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/data/input_scan.h"
#include "apps/data/prefetcher.h"
#include "apps/train/trainer.h"
#include "core/error.h"
#include "tests/cuda/backend_agreement.h"
#include "tests/cuda/train_run_support.h"
#include "tests/tensor_bytes.h"
#include "tests/train_only_source.h"

namespace mixprec {
namespace {

using cuda_test::gpu;
using namespace cuda_train_test;

// Batch n: F32 inputs [4, 3, 5, 5] (300 values, 0.5 * i - 7 n) or, with `tokens`, I32 ids
// [4, 6] (i + n), and I32 targets [4] (n + i) mod 10. Float batches 2 and 5 hold a non-finite
// value, at elements 17 * n (NaN for 2, -Inf for 5). Batch `fail_at` throws.
class DeviceTestSource final : public mixprec_test::TrainOnlySource {
 public:
  DeviceTestSource(bool tokens, int64_t fail_at = -1)
      : TrainOnlySource(4, true, 10, "device test source"), tokens_(tokens), fail_at_(fail_at) {}

  Batch train_batch(int64_t number) const override {
    MIXPREC_CHECK(number != fail_at_, "test source: batch ", number, " cannot be built");
    Batch batch;
    batch.number = number;
    batch.epoch = number / 4;
    std::vector<int32_t> labels(4);
    for (int32_t i = 0; i < 4; ++i) labels[i] = static_cast<int32_t>((number + i) % 10);
    batch.targets = Tensor::from_ints(labels, {4});
    if (tokens_) {
      std::vector<int32_t> ids(24);
      for (int32_t i = 0; i < 24; ++i) ids[i] = static_cast<int32_t>(i + number);
      batch.inputs = Tensor::from_ints(ids, {4, 6});
      return batch;
    }
    std::vector<float> values(300);
    for (size_t i = 0; i < values.size(); ++i) values[i] = 0.5f * i - 7.f * number;
    if (number == 2) values[34] = std::numeric_limits<float>::quiet_NaN();
    if (number == 5) values[85] = -std::numeric_limits<float>::infinity();
    batch.inputs = Tensor::from_vector(values, {4, 3, 5, 5});
    return batch;
  }

 private:
  bool tokens_;
  int64_t fail_at_;
};

// The first non-finite element of float batch n, by construction.
int64_t expected_bad_element(int64_t number) {
  return number == 2 ? 34 : number == 5 ? 85 : -1;
}

TEST_CASE("cuda: the prefetcher hands out train_batch(n) on cuda:0, scanned on the host",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  for (const bool tokens : {false, true}) {
    INFO((tokens ? "token ids" : "images"));
    const DeviceTestSource source(tokens);
    Prefetcher prefetcher(source, 1, gpu());
    for (int64_t n = 1; n < 8; ++n) {
      INFO("batch " << n);
      const Batch batch = prefetcher.next();
      const Batch expected = source.train_batch(n);
      CHECK(batch.number == n);
      CHECK(batch.epoch == n / 4);
      REQUIRE(batch.inputs.device() == gpu());
      REQUIRE(batch.targets.device() == gpu());
      REQUIRE(batch.inputs.shape() == expected.inputs.shape());
      REQUIRE(batch.inputs.dtype() == expected.inputs.dtype());
      REQUIRE(batch.targets.shape() == expected.targets.shape());
      CHECK(mixprec_test::raw_bytes(batch.inputs.to(kCPU)) ==
            mixprec_test::raw_bytes(expected.inputs));
      CHECK(mixprec_test::raw_bytes(batch.targets.to(kCPU)) ==
            mixprec_test::raw_bytes(expected.targets));
      REQUIRE(batch.input_scan.has_value());
      const int64_t bad = tokens ? -1 : expected_bad_element(n);
      CHECK(batch.input_scan->element == bad);
      if (n == 2 && !tokens) CHECK(std::isnan(batch.input_scan->value));
      if (n == 5 && !tokens) {
        CHECK(batch.input_scan->value == -std::numeric_limits<double>::infinity());
      }
    }
  }
}

TEST_CASE("cuda: the prefetcher casts images to FP16 on the host before the upload",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  const DeviceTestSource source(false);
  Prefetcher prefetcher(source, 1, gpu(), DType::F16);
  for (int64_t n = 1; n < 5; ++n) {
    INFO("batch " << n);
    const Batch batch = prefetcher.next();
    const Batch expected = source.train_batch(n);
    REQUIRE(batch.inputs.device() == gpu());
    REQUIRE(batch.inputs.dtype() == DType::F16);
    // The bits the training step's own cast on the device would have produced.
    CHECK(mixprec_test::raw_bytes(batch.inputs.to(kCPU)) ==
          mixprec_test::raw_bytes(expected.inputs.to(gpu()).to(DType::F16).to(kCPU)));
    REQUIRE(batch.input_scan.has_value());
    CHECK(batch.input_scan->element == expected_bad_element(n));
  }
}

TEST_CASE("cuda: the prefetcher on cuda:0 rethrows a failed batch from next()", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  const DeviceTestSource source(false, 3);
  Prefetcher prefetcher(source, 0, gpu());
  for (int64_t n = 0; n < 3; ++n) {
    const Batch batch = prefetcher.next();
    CHECK(batch.number == n);
    CHECK(batch.inputs.device() == gpu());
  }
  CHECK_THROWS_WITH(prefetcher.next(), "test source: batch 3 cannot be built");
  CHECK_THROWS_WITH(prefetcher.next(), "test source: batch 3 cannot be built");
}

LoggedRun prefetch_run(const std::string& config, std::vector<std::string> overrides) {
  return train_logged("cuda-prefetch-upload", config, std::move(overrides));
}

// train_run_support.h's small CNN on the MNIST test set in FP16 on cuda, in `dir`; empty
// (after a warning) when the data is not here.
std::string write_cnn_config(const ScratchDir& dir) {
  return write_small_mnist_cnn(dir.path(), "precision: fp16\ndevice: cuda\n");
}

TEST_CASE("cuda: prefetched uploads add no host wait to a run that reads at log steps",
          "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  ScratchDir dir("cuda-prefetch-upload-cnn");
  const std::string config = write_cnn_config(dir);
  if (config.empty()) return;
  // test_cuda_host_reads.cpp's schedule: logged at steps 1, 8 and 16 only.
  const LoggedRun run = prefetch_run(
      config, {"train.steps=16", "train.log_every=8", "train.eval_every=0", "checkpoint.every=0"});
  REQUIRE(run.summary["device"] == "cuda:0");
  std::vector<int64_t> logged;
  for (const auto& [step, record] : run.steps) logged.push_back(step);
  REQUIRE(logged == std::vector<int64_t>{1, 8, 16});
  for (int64_t step : {8, 16}) {
    INFO("step " << step);
    const double syncs = run.steps.at(step)["host_syncs_per_step"].get<double>();
    INFO("host syncs per step " << syncs);
    // The bound test_cuda_host_reads.cpp sets for this run: three reads a window, no more.
    CHECK(syncs <= 4.0 / 8.0);
    CHECK_FALSE(run.steps.at(step)["skipped"].get<bool>());
  }
}

TEST_CASE("cuda: an input injection on cuda:0 is reported at element 0 of its batch", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  ScratchDir dir("cuda-prefetch-upload-inject");
  const std::string config = write_cnn_config(dir);
  if (config.empty()) return;
  for (const std::string value : {"nan", "inf"}) {
    INFO("value " << value);
    // Two microbatches a step: step 2 is made of batches 2 and 3; the value goes into batch 2.
    const LoggedRun run = prefetch_run(
        config, {"train.steps=3", "train.log_every=1", "train.eval_every=0", "checkpoint.every=0",
                 "train.accumulation_steps=2",
                 "debug.inject_nonfinite={step: 2, tensor: input, value: " + value + "}"});
    REQUIRE(run.summary["device"] == "cuda:0");
    REQUIRE(run.steps.size() == 3);
    const nlohmann::json& r = run.steps.at(2);
    CHECK(r["skipped"].get<bool>());
    CHECK(r["reason"] == "input batch 2 has a non-finite value (" + value + ") at element 0");
    CHECK(r["input_batch"] == 2);
    CHECK(r["nonfinite_tensors"] == nlohmann::json::array({"input"}));
    CHECK(r["loss"].is_null());
    CHECK_FALSE(run.steps.at(1)["skipped"].get<bool>());
    CHECK_FALSE(run.steps.at(3)["skipped"].get<bool>());
  }
}

}  // namespace
}  // namespace mixprec
