// restore_run_state against state.json documents made by make_run_state and then damaged:
// what it restores, and that a hostile document is an Error, not a crash.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "amp/grad_scaler.h"
#include "amp/static_loss_scale.h"
#include "apps/train/run_state.h"
#include "core/error.h"
#include "core/generator.h"
#include "optim/sgd.h"

namespace {

using Catch::Matchers::Contains;
using namespace mixprec;

// What a run restores into: SGD over one parameter, a static loss scale, a dropout stream.
struct RunObjects {
  std::vector<Parameter> params{Parameter("w", Tensor::from_vector({1.0f, 2.0f}, {2}))};
  std::unique_ptr<SGD> optimizer;
  GradScaler scaler{std::make_unique<StaticLossScale>(8.0)};
  Generator dropout_gen;

  explicit RunObjects(double lr, uint64_t seed) : dropout_gen(seed) {
    SgdOptions options;
    options.lr = lr;
    options.momentum = 0.9;
    optimizer = std::make_unique<SGD>(params, options);
  }
  // The state.json a run with these objects writes at `position`.
  nlohmann::json state_of(const TrainConfig& config, const RunPosition& position = {}) const {
    return make_run_state(config, position, *optimizer, scaler, dropout_gen);
  }
  RunPosition restore(const nlohmann::json& state, const TrainConfig& config) {
    return restore_run_state(state, "run/state.json", config, *optimizer, scaler, dropout_gen);
  }
};

}  // namespace

TEST_CASE("run_state: a state written by make_run_state restores position, lr and generator",
          "[apps][run_state]") {
  const TrainConfig config;
  RunObjects saved(0.25, 11);
  saved.dropout_gen.next(40);  // the stream has moved on: offset 40
  const RunPosition position{7, 9, 2, 1.5, 100, {2.5, 2.25}};
  const nlohmann::json state = saved.state_of(config, position);

  RunObjects restored(0.01, 3);
  const RunPosition got = restored.restore(state, config);
  CHECK(got.step == 7);
  CHECK(got.next_batch == 9);
  CHECK(got.skipped_steps == 2);
  CHECK(got.train_seconds == 1.5);
  CHECK(got.schedule_steps == 100);
  CHECK(got.recent_losses == std::vector<double>{2.5, 2.25});
  CHECK(restored.optimizer->lr() == 0.25);
  CHECK(restored.dropout_gen.seed() == 11);
  CHECK(restored.dropout_gen.offset() == 40);

  // Another config (here: another seed) is refused.
  TrainConfig other = config;
  other.train.seed = 1;
  CHECK_THROWS_WITH(restored.restore(state, other),
                    Contains("run/state.json") && Contains("another config"));
}

TEST_CASE("run_state: fingerprints compare settings, and settings added since count as default",
          "[apps][run_state]") {
  const TrainConfig config;
  RunObjects saved(0.25, 11);
  const nlohmann::json good = saved.state_of(config);
  // A checkpoint of a mixprec that did not have tf32 and loss_scale.hysteresis_mode yet.
  std::string older = good["fingerprint"].get<std::string>();
  for (const std::string line : {"tf32: false\n", "  hysteresis_mode: reset_on_growth\n"}) {
    const size_t at = older.find(line);
    REQUIRE(at != std::string::npos);
    older.erase(at, line.size());
  }
  nlohmann::json state = good;
  state["fingerprint"] = older;
  RunObjects restored(0.01, 3);
  CHECK(restored.restore(state, config).step == 0);
  CHECK(restored.optimizer->lr() == 0.25);
  CHECK(fingerprint_differences(older, config).empty());

  // Moving a setting the checkpoint does not know from its default is a difference, and so is
  // any other setting; the message names them.
  TrainConfig with_tf32 = config;
  with_tf32.tf32 = true;
  CHECK(fingerprint_differences(older, with_tf32) == std::vector<std::string>{"tf32"});
  TrainConfig other = config;
  other.optimizer.lr = 0.5;
  other.loss_scale.hysteresis_mode = "consecutive";
  CHECK(fingerprint_differences(older, other) ==
        std::vector<std::string>{"loss_scale.hysteresis_mode", "optimizer.lr"});
  CHECK_THROWS_WITH(RunObjects(0.01, 3).restore(state, other),
                    Contains("another config (loss_scale.hysteresis_mode, optimizer.lr differ)"));
  // A setting the checkpoint has and this mixprec does not, and a fingerprint that is not YAML.
  const std::string retired = good["fingerprint"].get<std::string>() + "retired: 1\n";
  CHECK(fingerprint_differences(retired, config) == std::vector<std::string>{"retired"});
  CHECK(fingerprint_differences("{[", config).size() == 1);

  // Sections a default config does not have (data.normalize) compare as they are.
  TrainConfig normalised = config;
  normalised.data.mean = 0.5;
  normalised.data.std = 0.25;
  std::string written = resume_fingerprint(normalised);
  written.erase(written.find("tf32: false\n"), std::string("tf32: false\n").size());
  CHECK(fingerprint_differences(written, normalised).empty());
  TrainConfig other_std = normalised;
  other_std.data.std = 0.5;
  CHECK(fingerprint_differences(written, other_std) ==
        std::vector<std::string>{"data.normalize.std"});
  CHECK(fingerprint_differences(written, config) == std::vector<std::string>{"data.normalize"});
}

TEST_CASE("run_state: recent_losses are optional, and checked when present",
          "[apps][run_state]") {
  const TrainConfig config;
  RunObjects saved(0.25, 11);
  const nlohmann::json good = saved.state_of(config, RunPosition{7, 9, 2, 1.5, 100, {1.0}});
  // A state.json from before they were kept restores none.
  nlohmann::json older = good;
  older.erase("recent_losses");
  RunObjects restored(0.01, 3);
  CHECK(restored.restore(older, config).recent_losses.empty());
  CHECK(restored.optimizer->lr() == 0.25);
  // A longer list than the window is taken as it is; RunStats keeps its last 50.
  nlohmann::json longer = good;
  longer["recent_losses"] = std::vector<double>(60, 2.0);
  CHECK(RunObjects(0.01, 3).restore(longer, config).recent_losses.size() == 60);

  for (const auto& [bad, needle] : std::vector<std::pair<nlohmann::json, std::string>>{
           {nlohmann::json("1.0"), "must be an array of finite numbers"},
           {nlohmann::json::array({1.0, "2"}), "must hold finite numbers, got \"2\""},
           {nlohmann::json::array({1.0, nullptr}), "must hold finite numbers, got null"}}) {
    INFO(bad.dump());
    nlohmann::json state = good;
    state["recent_losses"] = bad;
    RunObjects fresh(0.01, 3);
    CHECK_THROWS_WITH(fresh.restore(state, config),
                      Contains("run/state.json: 'recent_losses'") && Contains(needle));
    CHECK(fresh.optimizer->lr() == 0.01);  // nothing was restored
  }
}

// Restoring copies the optimizer's scalars and quotes bad values in messages; both recursed
// once per level, so a document nested 200000 levels deep overflowed the stack.
TEST_CASE("run_state: a state.json nested 200000 levels deep is an Error, not a crash",
          "[apps][run_state]") {
  const TrainConfig config;
  RunObjects saved(0.25, 11);
  const nlohmann::json good = saved.state_of(config);
  const std::string deep_text = std::string(200000, '[') + std::string(200000, ']');

  for (const std::vector<std::string>& where :
       {std::vector<std::string>{"format"}, std::vector<std::string>{"step"},
        std::vector<std::string>{"optimizer", "scalars", "lr"},
        std::vector<std::string>{"scaler", "policy"}}) {
    INFO(where.back());
    nlohmann::json state = good;
    nlohmann::json* slot = &state;
    for (const std::string& key : where) slot = &(*slot)[key];
    *slot = nlohmann::json::parse(deep_text);
    RunObjects restored(0.01, 3);
    CHECK_THROWS_WITH(restored.restore(state, config),
                      Contains("run/state.json") && Contains("more than 32 levels deep"));
    // Nothing was restored.
    CHECK(restored.optimizer->lr() == 0.01);
    CHECK(restored.dropout_gen.seed() == 3);
  }

  // Shallow enough to read, too deep to quote: the message says what it is instead.
  nlohmann::json state = good;
  state["format"] = nlohmann::json::parse(std::string(20, '[') + std::string(20, ']'));
  RunObjects restored(0.01, 3);
  CHECK_THROWS_WITH(restored.restore(state, config),
                    Contains("format an array nested more than 16 levels deep"));
}

TEST_CASE("run_state: a resume may switch the TensorBoard log, and older checkpoints lack it",
          "[apps][run_state]") {
  const TrainConfig config;
  RunObjects saved(0.25, 11);
  const nlohmann::json state = saved.state_of(config);
  TrainConfig without_tensorboard = config;
  without_tensorboard.log.tensorboard = false;
  CHECK(RunObjects(0.01, 3).restore(state, without_tensorboard).step == 0);
  CHECK(fingerprint_differences(state["fingerprint"].get<std::string>(), without_tensorboard)
            .empty());
  // A checkpoint written before the log section existed.
  std::string older = state["fingerprint"].get<std::string>();
  const std::string section = "log:\n  tensorboard: true\n";
  const size_t at = older.find(section);
  REQUIRE(at != std::string::npos);
  older.erase(at, section.size());
  CHECK(fingerprint_differences(older, without_tensorboard).empty());
}
