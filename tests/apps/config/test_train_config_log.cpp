// The `log:` section: log.tensorboard's default, its values, its round trip through
// config.yaml, and the errors of a wrong value or a misspelt key.
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

struct LogConfigDir : TempDir {
  LogConfigDir() { config_test::write_idx_files(*this); }
  TrainConfig parse(const std::vector<std::string>& overrides = {}) const {
    return config_test::parse_in(*this, config_test::kMinimalCnn, overrides);
  }
  std::string parse_error(const std::vector<std::string>& overrides) const {
    return error_message([&] { parse(overrides); });
  }
};

}  // namespace

TEST_CASE("config: log.tensorboard is on by default and round-trips both values", "[config]") {
  const LogConfigDir dir;
  const TrainConfig defaults = dir.parse();
  CHECK(defaults.log.tensorboard);
  CHECK(mixprec::to_yaml(defaults).find("log:\n  tensorboard: true\n") != std::string::npos);
  for (const bool on : {true, false}) {
    INFO(on);
    const TrainConfig config = dir.parse({std::string("log.tensorboard=") + (on ? "true" : "false")});
    CHECK(config.log.tensorboard == on);
    const TrainConfig again =
        mixprec::parse_train_config(mixprec::to_yaml(config), dir.file("again.yaml"),
                                    dir.path().string());
    CHECK(again.log.tensorboard == on);
  }
  CHECK_FALSE(dir.parse({"log={tensorboard: False}"}).log.tensorboard);
}

TEST_CASE("config: a wrong log value or key is named with what was meant", "[config]") {
  const LogConfigDir dir;
  CHECK_THAT(dir.parse_error({"log.tensorboard=yes"}),
             Contains("log.tensorboard: expected true or false, got 'yes'"));
  CHECK_THAT(dir.parse_error({"log.tensorboard=\"false\""}),
             Contains("log.tensorboard: expected true or false, got the quoted string 'false'"));
  CHECK_THAT(dir.parse_error({"log=true"}), Contains("log: expected a map, got 'true'"));
  CHECK_THAT(dir.parse_error({"log.tensorbord=false"}),
             Contains("unknown key 'log.tensorbord' (did you mean 'tensorboard'?)"));
  CHECK_THAT(dir.parse_error({"log.tb=false"}), Contains("did you mean 'tensorboard'"));
  CHECK_THAT(dir.parse_error({"tensorboard=false"}), Contains("did you mean 'log'"));
}
