// Exit codes and messages of the mixprec command line.
#include <catch2/catch.hpp>

#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/cli.h"
#include "tests/apps/train_test_support.h"
#include "core/cpu/bf16_dot_gemm.h"
#include "core/cpu/f16_gemm.h"

#if MIXPREC_WITH_CUDA
#include "core/backend.h"
#include "cuda/device_query.h"
#endif

namespace {

using train_test::CliResult;

CliResult run(std::vector<const char*> args) {
  args.insert(args.begin(), "mixprec");
  std::ostringstream out;
  std::ostringstream err;
  CliResult result;
  result.code = mixprec::run_cli(static_cast<int>(args.size()), args.data(), out, err);
  result.out = out.str();
  result.err = err.str();
  return result;
}

size_t line_count(const std::string& text) {
  size_t lines = 0;
  for (char c : text) lines += c == '\n';
  return lines;
}

}  // namespace

TEST_CASE("mixprec explain formats prints the lesson", "[apps][cli]") {
  const CliResult r = run({"explain", "formats"});
  CHECK(r.code == 0);
  CHECK(r.err.empty());
  CHECK(r.out.find("65504") != std::string::npos);
}

TEST_CASE("mixprec explain: every topic prints its lesson and exits 0", "[apps][cli]") {
  for (const char* topic : {"formats", "underflow", "overflow", "clipping", "accumulation",
                            "distributed", "policies", "all"}) {
    const CliResult r = run({"explain", topic});
    INFO("mixprec explain " << topic << " -> stderr: " << r.err);
    CHECK(r.code == 0);
    CHECK(r.err.empty());
    CHECK(line_count(r.out) > 3);
  }
  // `all` is every lesson in order.
  const std::string all = run({"explain", "all"}).out;
  const size_t formats = all.find("Floating-point formats");
  const size_t underflow = all.find("saving a tiny FP16 gradient");
  const size_t overflow = all.find("overflow, a skipped step");
  const size_t clipping = all.find("unscale before clipping");
  const size_t accumulation = all.find("with gradient accumulation");
  const size_t distributed = all.find("the ranks agree on a skipped step");
  const size_t policies = all.find("Loss-scale policies: how S moves");
  CHECK(formats < underflow);
  CHECK(underflow < overflow);
  CHECK(overflow < clipping);
  CHECK(clipping < accumulation);
  CHECK(accumulation < distributed);
  CHECK(distributed < policies);
  CHECK(policies != std::string::npos);
}

TEST_CASE("mixprec explain <topic> --json prints one JSON object with the named fields",
          "[apps][cli]") {
  const std::vector<std::pair<const char*, std::vector<const char*>>> expected = {
      {"formats",
       {"fp16_max", "fp16_min_normal", "fp16_min_subnormal", "fp16_epsilon", "bf16_max",
        "bf16_min_normal", "bf16_min_subnormal", "bf16_epsilon", "fp32_max", "fp32_min_normal",
        "fp32_min_subnormal", "fp32_epsilon"}},
      {"underflow",
       {"fp16_unscaled", "loss_scaled", "fp16_scaled", "restored", "relative_error_percent",
        "w_new_scaled", "w_new_unscaled", "w_new_exact", "steps"}},
      {"overflow",
       {"scaled_grad", "skipped", "w_after_skip", "scale_after_backoff", "scaled_grad_retry",
        "w_after_step", "scale_after_growth", "steps"}},
      {"clipping", {"correct", "wrong_order", "wrong_order_norm", "refusal", "steps"}},
      {"accumulation",
       {"restored_mean", "unequal_restored_mean", "unequal_expected_mean", "naive_mean_of_means",
        "update_inside_window_error", "steps"}},
      {"distributed",
       {"rank_grads", "w_init", "lr", "init_scale", "fp16_max", "without_agreement",
        "with_agreement", "steps"}},
      {"policies",
       {"sequence", "none", "static", "dynamic", "hysteresis_reset_on_growth",
        "hysteresis_consecutive", "floor_and_ceiling", "steps"}},
  };
  for (const auto& [topic, keys] : expected) {
    const CliResult r = run({"explain", topic, "--json"});
    INFO("mixprec explain " << topic << " --json -> stderr: " << r.err);
    REQUIRE(r.code == 0);
    CHECK(r.err.empty());
    const nlohmann::json j = nlohmann::json::parse(r.out);
    REQUIRE(j.is_object());
    for (const char* key : keys) {
      INFO("key " << key);
      CHECK(j.contains(key));
    }
  }
  const nlohmann::json formats = nlohmann::json::parse(run({"explain", "formats", "--json"}).out);
  CHECK(formats.at("fp16_max").get<double>() == 65504.0);
  const nlohmann::json overflow = nlohmann::json::parse(run({"explain", "overflow", "--json"}).out);
  CHECK(overflow.at("scaled_grad") == "inf");
  CHECK(overflow.at("scale_after_backoff").get<double>() == 4096.0);
  // Static S = 1024 never moves; the dynamic policy halves it at the first overflow (step 3).
  const nlohmann::json policies = nlohmann::json::parse(run({"explain", "policies", "--json"}).out);
  CHECK(policies.at("sequence").size() == 13);
  CHECK(policies.at("static").at("next_scale") == nlohmann::json(std::vector<double>(13, 1024.0)));
  CHECK(policies.at("dynamic").at("event")[2] == "backed_off");
  CHECK(policies.at("dynamic").at("next_scale")[2].get<double>() == 512.0);
  // Without agreement rank 1 alone backs off; with it, both ranks do.
  const nlohmann::json distributed =
      nlohmann::json::parse(run({"explain", "distributed", "--json"}).out);
  const nlohmann::json& apart =
      distributed.at("without_agreement").at("per_step")[0].at("ranks");
  CHECK(apart[0].at("next_scale").get<double>() == 8192.0);
  CHECK(apart[1].at("next_scale").get<double>() == 4096.0);
  const nlohmann::json& together =
      distributed.at("with_agreement").at("per_step")[0].at("ranks");
  CHECK(together[0].at("next_scale").get<double>() == 4096.0);
  CHECK(together[1].at("next_scale").get<double>() == 4096.0);
}

TEST_CASE("mixprec explain policies prints one table per policy", "[apps][cli]") {
  const CliResult r = run({"explain", "policies"});
  CHECK(r.code == 0);
  CHECK(r.err.empty());
  for (const char* heading : {"none: NoLossScale", "static: StaticLossScale(1024)", "dynamic: ",
                              "hysteresis_reset_on_growth: ", "hysteresis_consecutive: ",
                              "floor_and_ceiling: "}) {
    INFO(heading);
    CHECK(r.out.find(std::string("\n") + heading) != std::string::npos);
  }
  CHECK(r.out.find("overflow_at_floor") != std::string::npos);
}

TEST_CASE("mixprec explain all --json prints one object keyed by topic", "[apps][cli]") {
  const CliResult r = run({"explain", "all", "--json"});
  REQUIRE(r.code == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  REQUIRE(j.is_object());
  CHECK(j.size() == 7);
  for (const char* topic : {"formats", "underflow", "overflow", "clipping", "accumulation",
                            "distributed", "policies"}) {
    INFO("topic " << topic);
    REQUIRE(j.contains(topic));
    CHECK(j.at(topic).is_object());
  }
  CHECK(j.at("clipping").at("wrong_order").size() == 2);
}

TEST_CASE("mixprec --version prints the version and succeeds", "[apps][cli]") {
  const CliResult r = run({"--version"});
  CHECK(r.code == 0);
  CHECK(r.out.find("mixprec ") != std::string::npos);
}

TEST_CASE("mixprec device reports without failing", "[apps][cli]") {
  const CliResult r = run({"device"});
  CHECK(r.code == 0);
  // The first line names the paths of the CPU's BF16 and FP16 products.
  CHECK(r.out.rfind("CPU: BF16 products: " + mixprec::cpu::bf16_products_path() +
                        "; FP16 products: " + mixprec::cpu::f16_products_path() + "\n",
                    0) == 0);
#if MIXPREC_WITH_CUDA
  CHECK(r.out.find("cuDNN") != std::string::npos);
#else
  CHECK(r.out.find("built without CUDA\n") != std::string::npos);
#endif
}

#if MIXPREC_WITH_CUDA
TEST_CASE("mixprec device says whether the CUDA backend is registered", "[apps][cli]") {
  const CliResult r = run({"device"});
  REQUIRE(r.code == 0);
  CHECK(line_count(r.out) == 3);
  const bool says_registered = r.out.find("CUDA backend: registered for cuda:0") != std::string::npos;
  const bool says_not_registered = r.out.find("CUDA backend: not registered (") != std::string::npos;
  CHECK(says_registered != says_not_registered);
  CHECK(says_registered == mixprec::has_backend(mixprec::DeviceType::CUDA));
  if (mixprec::cuda_device_count() == 0) {
    CHECK(r.out.find("no usable CUDA device") != std::string::npos);
  }
}
#endif

TEST_CASE("out-of-range counts of bench and inspect are said in the config's words",
          "[apps][cli]") {
  struct Case {
    std::vector<const char*> args;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {{"bench", "c.yaml", "--steps", "0"}, "error: --steps: must be >= 1, got 0"},
           {{"bench", "c.yaml", "--warmup", "-1"}, "error: --warmup: must be >= 0, got -1"},
           {{"bench", "c.yaml", "--steps", "2.5"},
            "error: --steps: expected an integer, got '2.5'"},
           {{"inspect", "c.yaml", "--steps", "-3"}, "error: --steps: must be >= 0, got -3"},
           {{"inspect", "c.yaml", "--batches", "0"}, "error: --batches: must be >= 1, got 0"}}) {
    const CliResult r = run(c.args);
    INFO(r.err);
    CHECK(r.code == 2);
    CHECK(r.err.rfind(c.message + " (run `mixprec --help` for usage)\n", 0) == 0);
  }
}

TEST_CASE("bad command lines exit with 2 and one message on stderr", "[apps][cli]") {
  for (const auto& args : std::vector<std::vector<const char*>>{
           {"frobnicate"},
           {},
           {"explain"},
           {"explain", "colours"},
           {"explain", "colours", "--json"},
           {"explain", "underflow", "--yaml"},
           {"explain", "overflow", "extra"},
           {"--no-such-flag"}}) {
    const CliResult r = run(args);
    std::string command_line = "mixprec";
    for (const char* arg : args) command_line += std::string(" ") + arg;
    INFO(command_line << " -> stderr: " << r.err);
    CHECK(r.code == 2);
    CHECK(r.out.empty());
    CHECK(r.err.rfind("error: ", 0) == 0);
    CHECK(line_count(r.err) == 1);
  }
}
