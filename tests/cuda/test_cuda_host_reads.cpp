// train.host_reads on cuda:0: left at auto, a GPU run decides each step's skip, scale, clip
// and learning rate on the device and reads them only at log steps (amp/deferred_steps.h),
// so the host waits three times a window (losses, Inf/NaN flags, clip norms) instead of at
// every step. The host's waits are counted (cuda_host_syncs: every copy to the host and
// every stream synchronisation) and logged per step in host_syncs_per_step; the steps
// themselves still follow the CPU reference run.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/train/trainer.h"
#include "cuda/register.h"
#include "tests/cuda/backend_agreement.h"
#include "tests/cuda/train_run_support.h"

namespace mixprec {
namespace {

using namespace cuda_train_test;

LoggedRun host_reads_run(const std::string& config, std::vector<std::string> overrides) {
  return train_logged("cuda-host-reads", config, std::move(overrides));
}

// 16 steps in FP16 with clipping, logged at steps 1, 8 and 16, nothing evaluated or saved
// before the end.
const std::vector<std::string> kSchedule = {"precision=fp16",      "train.steps=16",
                                            "train.log_every=8",   "train.eval_every=0",
                                            "checkpoint.every=0"};

// The tolerance of test_cuda_train_configs.cpp for FP16 runs against the CPU: 3e-2 relative
// on each loss, 1e-4 absolute.
bool fp16_loss_close(double expected, double actual) {
  if (!std::isfinite(expected) || !std::isfinite(actual)) {
    return std::isnan(expected) ? std::isnan(actual) : expected == actual;
  }
  return std::fabs(actual - expected) <= 1e-4 + 3e-2 * std::fabs(expected);
}

// Trains `config` three times: on cuda:0 with host_reads left at auto, on cuda:0 per step,
// and on the CPU (auto is per_step there). Checks the host's waits per step at the log
// steps 8 and 16 of both GPU runs, and the at_log run's losses, scales and skips against
// the CPU's.
void expect_reads_at_log_steps(const std::string& label, const std::string& config,
                               const std::vector<std::string>& overrides) {
  INFO(label);
  const LoggedRun deferred = host_reads_run(config, with(overrides, {"device=cuda"}));
  const LoggedRun per_step =
      host_reads_run(config, with(overrides, {"device=cuda", "train.host_reads=per_step"}));
  const LoggedRun cpu = host_reads_run(config, with(overrides, {"device=cpu"}));
  REQUIRE(deferred.summary["device"] == "cuda:0");

  // No step is skipped (the scale is far from FP16's overflow on these models), so the
  // windows are steps 2-8 and 9-16.
  std::vector<int64_t> logged;
  for (const auto& [step, record] : deferred.steps) logged.push_back(step);
  CHECK(logged == std::vector<int64_t>{1, 8, 16});
  std::ostringstream measured;
  for (int64_t step : {8, 16}) {
    INFO("step " << step);
    REQUIRE(deferred.steps.count(step) == 1);
    REQUIRE(per_step.steps.count(step) == 1);
    // Since the previous log step (7 or 8 steps): three reads of the window, nothing more.
    const double at_log = deferred.steps.at(step)["host_syncs_per_step"].get<double>();
    const double every_step = per_step.steps.at(step)["host_syncs_per_step"].get<double>();
    INFO("host syncs per step: at_log " << at_log << ", per_step " << every_step);
    measured << "step " << step << ": at_log " << at_log << ", per_step " << every_step << "; ";
    CHECK(at_log <= 4.0 / 8.0);
    // per_step resolves after every step: the loss, the Inf/NaN flags and the clip norm, each
    // a read.
    CHECK(every_step > 2.0);
  }
  WARN(label << ": host syncs per step " << measured.str()
             << "whole run (evaluation and checkpoint included): at_log "
             << deferred.summary.value("host_syncs_per_step", nlohmann::json()).dump()
             << ", per_step "
             << per_step.summary.value("host_syncs_per_step", nlohmann::json()).dump());

  // The same steps as the CPU reference, read later.
  REQUIRE(cpu.steps.size() == deferred.steps.size());
  for (const auto& [step, reference] : cpu.steps) {
    INFO("step " << step);
    REQUIRE(deferred.steps.count(step) == 1);
    const nlohmann::json& r = deferred.steps.at(step);
    const double expected = logged_number(reference["loss"]), actual = logged_number(r["loss"]);
    INFO("loss " << actual << ", CPU " << expected);
    CHECK(fp16_loss_close(expected, actual));
    CHECK(r["scale"] == reference["scale"]);
    CHECK(r["next_scale"] == reference["next_scale"]);
    CHECK(r["skipped"] == reference["skipped"]);
    CHECK(r["grad_norm"].is_number());  // clipped: the norm was read
  }
  CHECK(deferred.summary["skipped_steps"] == cpu.summary["skipped_steps"]);
  CHECK(deferred.summary["final_scale"] == cpu.summary["final_scale"]);
}

TEST_CASE("cuda: a GPT run left at auto reads the host only at log steps", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  const std::vector<std::string> gpt = small_gpt_run_or_warn(kSchedule);
  if (gpt.empty()) return;
  // gpt_shakespeare.yaml clips at 1.0 and runs AdamW with warmup and cosine decay.
  expect_reads_at_log_steps("gpt_shakespeare", config_path("gpt_shakespeare.yaml"), gpt);
}

TEST_CASE("cuda: a CNN run left at auto reads the host only at log steps", "[cuda]") {
  MIXPREC_REQUIRE_CUDA();
  ScratchDir dir("cuda-host-reads-cnn");
  const std::string config = write_small_mnist_cnn(dir.path());
  if (config.empty()) return;
  expect_reads_at_log_steps("small CNN on MNIST", config, kSchedule);
}

}  // namespace
}  // namespace mixprec
