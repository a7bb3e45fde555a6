// apps/train/training_setup.h from a TrainConfig: make_loss_scale_policy, the policy a config's
// loss_scale section gives, `auto` included (the precision's default kind, built from the same
// settings as an explicit policy, so a setting given beside auto is the one the run uses), and
// make_precision_policy's TF32 switch.
#include <catch2/catch.hpp>

#include <memory>
#include <string>

#include "amp/dynamic_loss_scale.h"
#include "apps/config/train_config.h"
#include "apps/train/training_setup.h"

namespace mixprec {
namespace {

TrainConfig with_scale(const std::string& precision, const std::string& policy) {
  TrainConfig config;
  config.precision = precision;
  config.loss_scale.policy = policy;
  config.loss_scale.init_scale = 1024.0;
  config.loss_scale.growth_factor = 4.0;
  config.loss_scale.backoff_factor = 0.25;
  config.loss_scale.growth_interval = 3;
  config.loss_scale.hysteresis = 2;
  config.loss_scale.hysteresis_mode = "consecutive";
  config.loss_scale.min_scale = 8.0;
  config.loss_scale.max_scale = 4096.0;
  config.loss_scale.floor_policy = "error";
  return config;
}

TEST_CASE("loss scale setup: auto in fp16 is dynamic with the config's settings",
          "[apps][train]") {
  for (const std::string policy : {"auto", "dynamic"}) {
    INFO(policy);
    const std::unique_ptr<LossScalePolicy> made =
        make_loss_scale_policy(with_scale("fp16", policy));
    REQUIRE(made->kind() == "dynamic");
    const auto& dynamic = dynamic_cast<const DynamicLossScale&>(*made);
    const DynamicLossScaleOptions& o = dynamic.options();
    CHECK(dynamic.scale() == 1024.0);
    CHECK(o.growth_factor == 4.0);
    CHECK(o.backoff_factor == 0.25);
    CHECK(o.growth_interval == 3);
    CHECK(o.hysteresis == 2);
    CHECK(o.hysteresis_mode == HysteresisMode::Consecutive);
    CHECK(o.min_scale == 8.0);
    CHECK(o.max_scale == 4096.0);
    CHECK(o.floor_policy == FloorPolicy::Error);
  }
}

TEST_CASE("loss scale setup: auto in fp32 and bf16 scales nothing", "[apps][train]") {
  for (const std::string precision : {"fp32", "bf16"}) {
    INFO(precision);
    const std::unique_ptr<LossScalePolicy> made =
        make_loss_scale_policy(with_scale(precision, "auto"));
    CHECK(made->kind() == "none");
    CHECK_FALSE(made->scales_loss());
  }
  CHECK(make_loss_scale_policy(with_scale("bf16", "static"))->scale() == 1024.0);
  CHECK(make_loss_scale_policy(with_scale("bf16", "dynamic"))->kind() == "dynamic");
}

TEST_CASE("loss scale setup: settings a dynamic scale refuses name the section",
          "[apps][train]") {
  TrainConfig config = with_scale("fp16", "auto");
  config.loss_scale.init_scale = 2.0;  // below min_scale
  CHECK_THROWS_WITH(make_loss_scale_policy(config), Catch::Contains("loss_scale: "));
}

TEST_CASE("precision setup: tf32 in the config is the policy's TF32 switch", "[apps][train]") {
  TrainConfig config;
  CHECK_FALSE(make_precision_policy(config).allow_tf32);
  config.tf32 = true;
  const PrecisionPolicy policy = make_precision_policy(config);
  CHECK(policy.allow_tf32);
  CHECK(policy.describe().find("TF32 on") != std::string::npos);
}

}  // namespace
}  // namespace mixprec
