// The config keys of the non-finite handling: train.max_consecutive_skips and the `loss` and
// `input` targets of debug.inject_nonfinite (default, range, to_yaml round trip).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "apps/config/train_config.h"
#include "core/error.h"
#include "tests/apps/config/config_test_dirs.h"
#include "tests/error_message.h"

using Catch::Contains;
using config_test::TempDir;
using mixprec::TrainConfig;
using mixprec_test::error_message;

namespace {

struct NonfiniteConfigDir : TempDir {
  NonfiniteConfigDir() { config_test::write_idx_files(*this); }
  TrainConfig parse(const std::vector<std::string>& overrides = {}) const {
    return config_test::parse_in(*this, config_test::kMinimalCnn, overrides);
  }
  TrainConfig round_trip(const TrainConfig& config) const {
    return mixprec::parse_train_config(mixprec::to_yaml(config), file("again.yaml"),
                                       path().string());
  }
};

}  // namespace

TEST_CASE("config: train.max_consecutive_skips defaults to 100 and round-trips", "[config][nonfinite]") {
  const NonfiniteConfigDir dir;
  const TrainConfig defaults = dir.parse();
  CHECK(defaults.train.max_consecutive_skips == 100);
  CHECK(mixprec::to_yaml(defaults).find("max_consecutive_skips: 100") != std::string::npos);
  for (int64_t value : {int64_t{0}, int64_t{5}, int64_t{1} << 40}) {
    INFO(value);
    const TrainConfig config = dir.parse({"train.max_consecutive_skips=" + std::to_string(value)});
    CHECK(config.train.max_consecutive_skips == value);
    CHECK(dir.round_trip(config).train.max_consecutive_skips == value);
  }
}

TEST_CASE("config: train.max_consecutive_skips out of range or misspelt", "[config][nonfinite]") {
  const NonfiniteConfigDir dir;
  CHECK_THAT(error_message([&] { dir.parse({"train.max_consecutive_skips=-1"}); }),
             Contains("train.max_consecutive_skips must be >= 0, got -1"));
  CHECK_THAT(error_message([&] { dir.parse({"train.max_consecutive_skips=1099511627777"}); }),
             Contains("train.max_consecutive_skips must be <= 1099511627776"));
  CHECK_THAT(error_message([&] { dir.parse({"train.max_consecutive_skips=many"}); }),
             Contains("train.max_consecutive_skips: expected an integer, got 'many'"));
  CHECK_THAT(error_message([&] { dir.parse({"train.max_skips=3"}); }),
             Contains("did you mean 'max_consecutive_skips'"));
}

TEST_CASE("config: inject_nonfinite takes loss and input as tensors and round-trips them",
          "[config][nonfinite]") {
  const NonfiniteConfigDir dir;
  for (const char* tensor : {"loss", "input", "0.weight"}) {
    INFO(tensor);
    const TrainConfig config = dir.parse(
        {std::string("debug.inject_nonfinite={step: 4, tensor: ") + tensor + ", value: nan}"});
    CHECK(config.debug.inject_step == 4);
    CHECK(config.debug.inject_tensor == tensor);
    CHECK(config.debug.inject_value == "nan");
    const TrainConfig again = dir.round_trip(config);
    CHECK(again.debug.inject_step == 4);
    CHECK(again.debug.inject_tensor == tensor);
    CHECK(again.debug.inject_value == "nan");
  }
  CHECK_THAT(error_message([&] { dir.parse({"debug.inject_nonfinite={step: 4}"}); }),
             Contains("a parameter name, loss or input"));
}
