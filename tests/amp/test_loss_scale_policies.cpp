// Loss-scale policies: traces of scripted found_inf sequences against scales and events
// derived by hand from the rule (PyTorch's GradScaler plus hysteresis, floor and ceiling),
// option validation, and exact state save/restore.
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "amp/dynamic_loss_scale.h"
#include "amp/loss_scale.h"
#include "amp/no_loss_scale.h"
#include "amp/static_loss_scale.h"
#include "core/error.h"

using namespace mixprec;
using Catch::Matchers::Contains;

namespace {

// One expected update: the flag fed in, then the scale, event and counters after it.
struct Expected {
  bool found_inf;
  double scale;
  ScaleEvent event;
  int growth_tracker;
  int hysteresis_left;
};

constexpr bool T = true;
constexpr bool F = false;
constexpr ScaleEvent kKept = ScaleEvent::Kept;
constexpr ScaleEvent kGrew = ScaleEvent::Grew;
constexpr ScaleEvent kBackedOff = ScaleEvent::BackedOff;
constexpr ScaleEvent kTolerated = ScaleEvent::OverflowTolerated;
constexpr ScaleEvent kAtFloor = ScaleEvent::OverflowAtFloor;

void check_trace(LossScalePolicy& policy, const std::vector<Expected>& trace) {
  for (size_t i = 0; i < trace.size(); ++i) {
    const Expected& e = trace[i];
    INFO("update " << i << " (found_inf " << e.found_inf << ")");
    const double before = policy.scale();
    const ScaleChange change = policy.update(e.found_inf);
    CHECK(change.before == before);
    CHECK(change.after == e.scale);
    CHECK(policy.scale() == e.scale);
    CHECK(scale_event_name(change.event) == scale_event_name(e.event));
    CHECK(policy.growth_tracker() == e.growth_tracker);
    CHECK(policy.hysteresis_left() == e.hysteresis_left);
  }
}

uint64_t bits(double value) { return std::bit_cast<uint64_t>(value); }

// Fixed pseudo-random overflow pattern for the save/restore trajectories.
bool scripted_flag(int step) { return (step * 7 + step / 3) % 5 == 0; }

// A JSON text round trip, as a checkpoint file does.
nlohmann::json through_text(const nlohmann::json& state) {
  return nlohmann::json::parse(state.dump());
}

}  // namespace

TEST_CASE("names of floor policies, hysteresis modes and scale events round-trip",
          "[amp][loss_scale]") {
  for (FloorPolicy p : {FloorPolicy::Clamp, FloorPolicy::Warn, FloorPolicy::Error}) {
    CHECK(parse_floor_policy(floor_policy_name(p)) == p);
  }
  CHECK(floor_policy_name(FloorPolicy::Clamp) == "clamp");
  CHECK(floor_policy_name(FloorPolicy::Warn) == "warn");
  CHECK(floor_policy_name(FloorPolicy::Error) == "error");
  REQUIRE_THROWS_WITH(parse_floor_policy("ignore"),
                      Contains("ignore") && Contains("clamp, warn, error"));

  CHECK(hysteresis_mode_name(HysteresisMode::ResetOnGrowth) == "reset_on_growth");
  CHECK(hysteresis_mode_name(HysteresisMode::Consecutive) == "consecutive");
  CHECK(parse_hysteresis_mode("reset_on_growth") == HysteresisMode::ResetOnGrowth);
  CHECK(parse_hysteresis_mode("consecutive") == HysteresisMode::Consecutive);
  REQUIRE_THROWS_WITH(parse_hysteresis_mode("Consecutive"),
                      Contains("reset_on_growth, consecutive"));

  CHECK(scale_event_name(ScaleEvent::Kept) == "kept");
  CHECK(scale_event_name(ScaleEvent::Grew) == "grew");
  CHECK(scale_event_name(ScaleEvent::BackedOff) == "backed_off");
  CHECK(scale_event_name(ScaleEvent::OverflowTolerated) == "overflow_tolerated");
  CHECK(scale_event_name(ScaleEvent::OverflowAtFloor) == "overflow_at_floor");
}

TEST_CASE("StaticLossScale never moves", "[amp][loss_scale]") {
  StaticLossScale policy(1024.0);
  CHECK(policy.kind() == "static");
  CHECK(policy.scales_loss());
  CHECK(policy.scale() == 1024.0);
  check_trace(policy, {
                          {F, 1024.0, kKept, 0, 0},
                          {T, 1024.0, kTolerated, 0, 0},
                          {T, 1024.0, kTolerated, 0, 0},
                          {F, 1024.0, kKept, 0, 0},
                          {F, 1024.0, kKept, 0, 0},
                      });
  for (int i = 0; i < 3000; ++i) policy.update(false);  // past any growth interval
  CHECK(policy.scale() == 1024.0);

  for (double bad : {0.0, -8.0, std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::quiet_NaN()}) {
    REQUIRE_THROWS_WITH(StaticLossScale(bad), Contains("scale must be finite and > 0"));
  }
}

TEST_CASE("NoLossScale has scale 1 and does not scale the loss", "[amp][loss_scale]") {
  NoLossScale policy;
  CHECK(policy.kind() == "none");
  CHECK(policy.scale() == 1.0);
  CHECK_FALSE(policy.scales_loss());
  check_trace(policy, {
                          {F, 1.0, kKept, 0, 0},
                          {T, 1.0, kTolerated, 0, 0},
                          {F, 1.0, kKept, 0, 0},
                      });
  const auto copy = policy.clone();
  CHECK(copy->kind() == "none");
  CHECK_FALSE(copy->scales_loss());
  CHECK(policy.state_dict() == nlohmann::json{{"kind", "none"}});
}

TEST_CASE("DynamicLossScale starts at init_scale with full hysteresis", "[amp][loss_scale]") {
  DynamicLossScaleOptions options;
  options.init_scale = 512.0;
  options.hysteresis = 4;
  DynamicLossScale policy(options);
  CHECK(policy.kind() == "dynamic");
  CHECK(policy.scales_loss());
  CHECK(policy.scale() == 512.0);
  CHECK(policy.growth_tracker() == 0);
  CHECK(policy.hysteresis_left() == 4);
}

TEST_CASE("DynamicLossScale with PyTorch defaults: backoff and growth after 2000 steps",
          "[amp][loss_scale]") {
  DynamicLossScale policy;
  CHECK(policy.scale() == 65536.0);
  CHECK(policy.hysteresis_left() == 1);
  CHECK(policy.floor_policy() == FloorPolicy::Clamp);

  // Overflow at 2^16: back off by 0.5.
  check_trace(policy, {{T, 32768.0, kBackedOff, 0, 1}});
  // 1999 finite steps keep the scale; the 2000th doubles it and restarts the count.
  for (int i = 1; i <= 1999; ++i) {
    const ScaleChange change = policy.update(false);
    REQUIRE(change.event == ScaleEvent::Kept);
    REQUIRE(policy.scale() == 32768.0);
    REQUIRE(policy.growth_tracker() == i);
  }
  check_trace(policy, {{F, 65536.0, kGrew, 0, 1}});

  // An overflow part-way restarts the count: 1000 finite, overflow, then 2000 more needed.
  for (int i = 0; i < 1000; ++i) policy.update(false);
  CHECK(policy.growth_tracker() == 1000);
  check_trace(policy, {{T, 32768.0, kBackedOff, 0, 1}});
  for (int i = 0; i < 1999; ++i) policy.update(false);
  CHECK(policy.scale() == 32768.0);
  check_trace(policy, {{F, 65536.0, kGrew, 0, 1}});
}

TEST_CASE("DynamicLossScale with a small growth interval", "[amp][loss_scale]") {
  DynamicLossScaleOptions options;
  options.init_scale = 8.0;
  options.growth_interval = 3;
  DynamicLossScale policy(options);
  check_trace(policy, {
                          {F, 8.0, kKept, 1, 1},
                          {F, 8.0, kKept, 2, 1},
                          {F, 16.0, kGrew, 0, 1},
                          {F, 16.0, kKept, 1, 1},
                          {F, 16.0, kKept, 2, 1},
                          {F, 32.0, kGrew, 0, 1},
                          {T, 16.0, kBackedOff, 0, 1},
                          {F, 16.0, kKept, 1, 1},
                          {F, 16.0, kKept, 2, 1},
                          {T, 8.0, kBackedOff, 0, 1},
                          {T, 4.0, kBackedOff, 0, 1},
                      });
}

TEST_CASE("DynamicLossScale reproduces the explainer's overflow and growth example",
          "[amp][loss_scale]") {
  // g = 10 at S = 8192 gives 81920 > 65504: skip and back off to 4096. With
  // growth_interval = 2, two finite steps raise 4096 back to 8192.
  DynamicLossScaleOptions options;
  options.init_scale = 8192.0;
  options.growth_interval = 2;
  DynamicLossScale policy(options);
  check_trace(policy, {
                          {T, 4096.0, kBackedOff, 0, 1},
                          {F, 4096.0, kKept, 1, 1},
                          {F, 8192.0, kGrew, 0, 1},
                      });
}

TEST_CASE("DynamicLossScale hysteresis in reset_on_growth mode", "[amp][loss_scale]") {
  // Overflows that are not in a row still use up hysteresis; only a growth refills it.
  DynamicLossScaleOptions options;
  options.init_scale = 1024.0;
  options.growth_interval = 4;
  options.hysteresis = 3;
  options.hysteresis_mode = HysteresisMode::ResetOnGrowth;
  DynamicLossScale policy(options);
  check_trace(policy, {
                          {T, 1024.0, kTolerated, 0, 2},
                          {F, 1024.0, kKept, 1, 2},
                          {T, 1024.0, kTolerated, 0, 1},
                          {F, 1024.0, kKept, 1, 1},
                          {T, 512.0, kBackedOff, 0, 1},
                          {T, 256.0, kBackedOff, 0, 1},
                          {F, 256.0, kKept, 1, 1},
                          {F, 256.0, kKept, 2, 1},
                          {F, 256.0, kKept, 3, 1},
                          {F, 512.0, kGrew, 0, 3},
                          {T, 512.0, kTolerated, 0, 2},
                          {T, 512.0, kTolerated, 0, 1},
                          {T, 256.0, kBackedOff, 0, 1},
                          {T, 128.0, kBackedOff, 0, 1},
                      });
}

TEST_CASE("DynamicLossScale hysteresis in consecutive mode", "[amp][loss_scale]") {
  // Same flags as the reset_on_growth trace: here every finite step refills the hysteresis,
  // so only the final run of overflows backs off.
  DynamicLossScaleOptions options;
  options.init_scale = 1024.0;
  options.growth_interval = 4;
  options.hysteresis = 3;
  options.hysteresis_mode = HysteresisMode::Consecutive;
  DynamicLossScale policy(options);
  check_trace(policy, {
                          {T, 1024.0, kTolerated, 0, 2},
                          {F, 1024.0, kKept, 1, 3},
                          {T, 1024.0, kTolerated, 0, 2},
                          {F, 1024.0, kKept, 1, 3},
                          {T, 1024.0, kTolerated, 0, 2},
                          {T, 1024.0, kTolerated, 0, 1},
                          {F, 1024.0, kKept, 1, 3},
                          {F, 1024.0, kKept, 2, 3},
                          {F, 1024.0, kKept, 3, 3},
                          {F, 2048.0, kGrew, 0, 3},
                          {T, 2048.0, kTolerated, 0, 2},
                          {T, 2048.0, kTolerated, 0, 1},
                          {T, 1024.0, kBackedOff, 0, 1},
                          {T, 512.0, kBackedOff, 0, 1},
                      });
}

TEST_CASE("DynamicLossScale floor: backoff clamps to min_scale, then overflow_at_floor",
          "[amp][loss_scale]") {
  for (FloorPolicy floor : {FloorPolicy::Clamp, FloorPolicy::Warn, FloorPolicy::Error}) {
    INFO("floor_policy " << floor_policy_name(floor));
    DynamicLossScaleOptions options;
    options.init_scale = 3.0;
    options.min_scale = 2.0;
    options.growth_interval = 2;
    options.floor_policy = floor;
    DynamicLossScale policy(options);
    CHECK(policy.floor_policy() == floor);
    // 3 * 0.5 = 1.5 < 2: clamped to 2. The policy only reports the floor; acting on it
    // (warning, error) is GradScaler's job, so the trace is the same for every policy.
    check_trace(policy, {
                            {T, 2.0, kBackedOff, 0, 1},
                            {T, 2.0, kAtFloor, 0, 1},
                            {T, 2.0, kAtFloor, 0, 1},
                            {F, 2.0, kKept, 1, 1},
                            {F, 4.0, kGrew, 0, 1},
                            {T, 2.0, kBackedOff, 0, 1},
                            {T, 2.0, kAtFloor, 0, 1},
                        });
  }

  DynamicLossScaleOptions at_floor;
  at_floor.init_scale = 1.0;
  at_floor.min_scale = 1.0;
  DynamicLossScale policy(at_floor);
  check_trace(policy, {{T, 1.0, kAtFloor, 0, 1}});
}

TEST_CASE("DynamicLossScale ceiling: growth stops at max_scale", "[amp][loss_scale]") {
  SECTION("power-of-two ceiling") {
    DynamicLossScaleOptions options;
    options.init_scale = 4194304.0;  // 2^22
    options.growth_interval = 1;
    DynamicLossScale policy(options);  // max_scale 2^24
    check_trace(policy, {
                            {F, 8388608.0, kGrew, 0, 1},
                            {F, 16777216.0, kGrew, 0, 1},
                            {F, 16777216.0, kKept, 0, 1},
                            {F, 16777216.0, kKept, 0, 1},
                            {T, 8388608.0, kBackedOff, 0, 1},
                            {F, 16777216.0, kGrew, 0, 1},
                        });
  }
  SECTION("a ceiling that is not a power of two caps the product") {
    DynamicLossScaleOptions options;
    options.init_scale = 2097152.0;  // 2^21; doubled to 4194304 > 3e6
    options.max_scale = 3e6;
    options.growth_interval = 1;
    DynamicLossScale policy(options);
    check_trace(policy, {
                            {F, 3e6, kGrew, 0, 1},
                            {F, 3e6, kKept, 0, 1},
                            {T, 1.5e6, kBackedOff, 0, 1},
                            {F, 3e6, kGrew, 0, 1},
                        });
  }
  SECTION("a huge ceiling: a product that overflows double is capped, never inf") {
    DynamicLossScaleOptions options;
    options.init_scale = DBL_MAX / 1.5;  // times 2 overflows to inf
    options.max_scale = DBL_MAX;
    options.growth_interval = 1;
    options.growth_factor = 2.0;
    DynamicLossScale policy(options);
    check_trace(policy, {
                            {F, DBL_MAX, kGrew, 0, 1},
                            {F, DBL_MAX, kKept, 0, 1},
                            {F, DBL_MAX, kKept, 0, 1},
                        });
    CHECK(std::isfinite(policy.scale()));
    check_trace(policy, {{T, DBL_MAX * 0.5, kBackedOff, 0, 1}});
  }
}

TEST_CASE("DynamicLossScale options are validated, naming the setting", "[amp][loss_scale]") {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  struct Case {
    const char* what;
    void (*edit)(DynamicLossScaleOptions&, double, double);
    const char* message;
  };
  const std::vector<Case> cases = {
      {"growth_factor 1", [](auto& o, double, double) { o.growth_factor = 1.0; },
       "growth_factor must be > 1, got 1"},
      {"growth_factor 0.5", [](auto& o, double, double) { o.growth_factor = 0.5; },
       "growth_factor must be > 1, got 0.5"},
      {"backoff_factor 0", [](auto& o, double, double) { o.backoff_factor = 0.0; },
       "backoff_factor must be > 0 and < 1, got 0"},
      {"backoff_factor 1", [](auto& o, double, double) { o.backoff_factor = 1.0; },
       "backoff_factor must be > 0 and < 1, got 1"},
      {"backoff_factor -0.5", [](auto& o, double, double) { o.backoff_factor = -0.5; },
       "backoff_factor must be > 0 and < 1, got -0.5"},
      {"growth_interval 0", [](auto& o, double, double) { o.growth_interval = 0; },
       "growth_interval must be >= 1, got 0"},
      {"hysteresis 0", [](auto& o, double, double) { o.hysteresis = 0; },
       "hysteresis must be >= 1, got 0"},
      {"min_scale 0", [](auto& o, double, double) { o.min_scale = 0.0; },
       "min_scale must be > 0, got 0"},
      {"min > init", [](auto& o, double, double) { o.min_scale = 131072.0; },
       "min_scale must be <= init_scale, got min_scale 131072 > init_scale 65536"},
      {"init > max", [](auto& o, double, double) { o.init_scale = 33554432.0; },
       "init_scale must be <= max_scale, got init_scale 33554432 > max_scale 16777216"},
      {"init_scale NaN", [](auto& o, double, double n) { o.init_scale = n; },
       "init_scale must be finite, got nan"},
      {"init_scale inf", [](auto& o, double i, double) { o.init_scale = i; },
       "init_scale must be finite, got inf"},
      {"growth_factor inf", [](auto& o, double i, double) { o.growth_factor = i; },
       "growth_factor must be finite, got inf"},
      {"growth_factor NaN", [](auto& o, double, double n) { o.growth_factor = n; },
       "growth_factor must be finite, got nan"},
      {"backoff_factor NaN", [](auto& o, double, double n) { o.backoff_factor = n; },
       "backoff_factor must be finite, got nan"},
      {"min_scale NaN", [](auto& o, double, double n) { o.min_scale = n; },
       "min_scale must be finite, got nan"},
      {"max_scale inf", [](auto& o, double i, double) { o.max_scale = i; },
       "max_scale must be finite, got inf"},
      {"max_scale NaN", [](auto& o, double, double n) { o.max_scale = n; },
       "max_scale must be finite, got nan"},
  };
  REQUIRE_NOTHROW(validate(DynamicLossScaleOptions{}));
  for (const Case& c : cases) {
    INFO(c.what);
    DynamicLossScaleOptions options;
    c.edit(options, inf, nan);
    REQUIRE_THROWS_AS(validate(options), Error);
    REQUIRE_THROWS_WITH(validate(options), Contains(c.message));
    REQUIRE_THROWS_WITH(DynamicLossScale(options), Contains(c.message));
  }
}

TEST_CASE("doubles round-trip exactly through JSON text", "[amp][loss_scale]") {
  const std::vector<double> values = {
      0.1,
      1.0 / 3.0,
      2.0 / 3.0 * 1e-300,
      std::nextafter(1.0, 2.0),
      std::nextafter(65536.0, 0.0),
      DBL_MAX,
      DBL_MIN,
      std::numeric_limits<double>::denorm_min(),
      123456789.123456789,
      65536.0 * std::pow(1.7, 13) / std::pow(3.0, 5),
  };
  for (double value : values) {
    INFO(value);
    const nlohmann::json parsed = nlohmann::json::parse(nlohmann::json(value).dump());
    REQUIRE(parsed.is_number());
    CHECK(bits(parsed.get<double>()) == bits(value));
  }
}

TEST_CASE("DynamicLossScale state round trip continues the exact trajectory",
          "[amp][loss_scale]") {
  // Settings whose products are not exact in binary, so a lossy save would show up.
  DynamicLossScaleOptions options;
  options.init_scale = 1000.0;
  options.growth_factor = 1.7;
  options.backoff_factor = 1.0 / 3.0;
  options.growth_interval = 3;
  options.hysteresis = 2;
  options.hysteresis_mode = HysteresisMode::Consecutive;
  options.min_scale = 0.1;
  options.max_scale = 1e7;
  options.floor_policy = FloorPolicy::Warn;
  DynamicLossScale original(options);
  for (int step = 0; step < 20; ++step) original.update(scripted_flag(step));
  // The trajectory must have left its starting point for the comparison to mean anything.
  REQUIRE(original.scale() != 1000.0);

  const nlohmann::json saved = through_text(original.state_dict());
  CHECK(saved.at("kind") == "dynamic");
  CHECK(saved.at("hysteresis_mode") == "consecutive");
  CHECK(saved.at("floor_policy") == "warn");
  CHECK(bits(saved.at("scale").get<double>()) == bits(original.scale()));
  CHECK(bits(saved.at("backoff_factor").get<double>()) == bits(1.0 / 3.0));

  DynamicLossScale loaded;  // PyTorch defaults, all overwritten by the load
  loaded.load_state_dict(saved);
  const std::unique_ptr<LossScalePolicy> built = loss_scale_from_state(saved);
  REQUIRE(built->kind() == "dynamic");
  CHECK(loaded.floor_policy() == FloorPolicy::Warn);
  CHECK(loaded.options().hysteresis_mode == HysteresisMode::Consecutive);
  CHECK(bits(loaded.options().growth_factor) == bits(1.7));
  CHECK(loaded.options().growth_interval == 3);
  CHECK(bits(loaded.options().min_scale) == bits(0.1));

  int moves = 0;
  for (int step = 20; step < 60; ++step) {
    INFO("step " << step);
    const bool flag = scripted_flag(step);
    const ScaleChange a = original.update(flag);
    const ScaleChange b = loaded.update(flag);
    const ScaleChange c = built->update(flag);
    if (a.after != a.before) ++moves;
    REQUIRE(bits(a.after) == bits(b.after));
    REQUIRE(bits(a.after) == bits(c.after));
    REQUIRE(a.event == b.event);
    REQUIRE(a.event == c.event);
    REQUIRE(original.growth_tracker() == loaded.growth_tracker());
    REQUIRE(original.growth_tracker() == built->growth_tracker());
    REQUIRE(original.hysteresis_left() == loaded.hysteresis_left());
    REQUIRE(original.hysteresis_left() == built->hysteresis_left());
  }
  CHECK(moves > 3);
  CHECK(original.state_dict().dump() == loaded.state_dict().dump());
}

TEST_CASE("clone continues independently", "[amp][loss_scale]") {
  DynamicLossScaleOptions options;
  options.init_scale = 64.0;
  options.growth_interval = 2;
  DynamicLossScale policy(options);
  policy.update(false);
  const auto copy = policy.clone();
  copy->update(false);  // grows the copy only
  CHECK(copy->scale() == 128.0);
  CHECK(policy.scale() == 64.0);
  CHECK(policy.growth_tracker() == 1);
  policy.update(false);
  CHECK(policy.scale() == 128.0);
}

TEST_CASE("DynamicLossScale load rejects bad states and leaves the policy unchanged",
          "[amp][loss_scale]") {
  DynamicLossScaleOptions options;
  options.init_scale = 256.0;
  options.growth_interval = 10;
  options.hysteresis = 3;
  DynamicLossScale source(options);
  source.update(true);
  source.update(false);
  const nlohmann::json good = source.state_dict();  // scale 256, tracker 1, hysteresis 2

  DynamicLossScaleOptions target_options;
  target_options.init_scale = 4096.0;
  target_options.growth_interval = 5;
  DynamicLossScale target(target_options);
  target.update(true);
  target.update(false);
  target.update(false);
  const std::string before = target.state_dict().dump();

  const auto expect_rejected = [&](const nlohmann::json& state, const std::string& fragment) {
    INFO(state.dump());
    REQUIRE_THROWS_AS(target.load_state_dict(state), Error);
    REQUIRE_THROWS_WITH(target.load_state_dict(state), Contains(fragment));
    REQUIRE(target.state_dict().dump() == before);
  };

  REQUIRE_NOTHROW(DynamicLossScale().load_state_dict(good));

  SECTION("not an object") { expect_rejected(nlohmann::json::array({1, 2}), "JSON object"); }
  SECTION("wrong kind") {
    expect_rejected(StaticLossScale(8.0).state_dict(), "\"static\"");
    expect_rejected(NoLossScale().state_dict(), "\"none\"");
  }
  SECTION("each missing field is named") {
    for (const auto& [key, value] : good.items()) {
      nlohmann::json state = good;
      state.erase(key);
      expect_rejected(state, "\"" + key + "\"");
    }
  }
  SECTION("each field of the wrong JSON type is named") {
    for (const auto& [key, value] : good.items()) {
      nlohmann::json state = good;
      state[key] = value.is_string() ? nlohmann::json(3) : nlohmann::json("3");
      expect_rejected(state, "\"" + key + "\"");
    }
    for (const char* key : {"growth_interval", "hysteresis", "growth_tracker",
                            "hysteresis_left"}) {
      nlohmann::json state = good;
      state[key] = 2.5;
      expect_rejected(state, std::string("\"") + key + "\" must be an integer");
    }
    nlohmann::json state = good;
    state["scale"] = true;
    expect_rejected(state, "\"scale\" must be a number");
    state = good;
    state["growth_interval"] = int64_t{1} << 40;
    expect_rejected(state, "\"growth_interval\"");
  }
  SECTION("invalid settings are rejected as by the constructor") {
    nlohmann::json state = good;
    state["growth_factor"] = 1.0;
    expect_rejected(state, "growth_factor must be > 1, got 1");
    state = good;
    state["backoff_factor"] = 1.0;
    expect_rejected(state, "backoff_factor");
    state = good;
    state["min_scale"] = 512.0;  // above init_scale 256
    expect_rejected(state, "min_scale must be <= init_scale");
    state = good;
    state["floor_policy"] = "sometimes";
    expect_rejected(state, "floor_policy");
    state = good;
    state["hysteresis_mode"] = "always";
    expect_rejected(state, "hysteresis_mode");
  }
  SECTION("state out of range") {
    nlohmann::json state = good;
    state["scale"] = 0.5;  // below min_scale 1
    expect_rejected(state, "scale must be finite and within [min_scale, max_scale]");
    state["scale"] = 33554432.0;  // above max_scale 2^24
    expect_rejected(state, "scale must be finite and within");
    state["scale"] = std::numeric_limits<double>::quiet_NaN();
    expect_rejected(state, "scale must be finite");
    state = good;
    state["growth_tracker"] = -1;
    expect_rejected(state, "growth_tracker must be within [0, growth_interval)");
    state["growth_tracker"] = 10;  // == growth_interval: the rule would have grown already
    expect_rejected(state, "growth_tracker");
    state = good;
    state["hysteresis_left"] = 0;
    expect_rejected(state, "hysteresis_left must be within [1, hysteresis]");
    state["hysteresis_left"] = 4;
    expect_rejected(state, "hysteresis_left");
  }
}

TEST_CASE("StaticLossScale and NoLossScale state round trips and rejections",
          "[amp][loss_scale]") {
  StaticLossScale source(0.1 * 3.0);
  const nlohmann::json saved = through_text(source.state_dict());
  StaticLossScale loaded(1.0);
  loaded.load_state_dict(saved);
  CHECK(bits(loaded.scale()) == bits(0.1 * 3.0));
  const auto built = loss_scale_from_state(saved);
  CHECK(built->kind() == "static");
  CHECK(bits(built->scale()) == bits(0.1 * 3.0));

  StaticLossScale target(4.0);
  const auto static_rejected = [&](const nlohmann::json& state, const std::string& fragment) {
    REQUIRE_THROWS_WITH(target.load_state_dict(state), Contains(fragment));
    REQUIRE(target.scale() == 4.0);
  };
  static_rejected(DynamicLossScale().state_dict(), "\"dynamic\"");
  static_rejected({{"kind", "static"}}, "\"scale\"");
  static_rejected({{"kind", "static"}, {"scale", "8"}}, "\"scale\" must be a number");
  static_rejected({{"kind", "static"}, {"scale", 0.0}}, "scale must be finite and > 0");
  static_rejected({{"kind", "static"}, {"scale", -2.0}}, "scale must be finite and > 0");

  NoLossScale none;
  REQUIRE_NOTHROW(none.load_state_dict(through_text(none.state_dict())));
  REQUIRE_THROWS_WITH(none.load_state_dict(StaticLossScale(2.0).state_dict()),
                      Contains("\"static\""));
  const auto built_none = loss_scale_from_state(none.state_dict());
  CHECK(built_none->kind() == "none");
  CHECK_FALSE(built_none->scales_loss());
}

TEST_CASE("loss_scale_from_state rejects an unknown or missing kind", "[amp][loss_scale]") {
  REQUIRE_THROWS_WITH(loss_scale_from_state({{"kind", "adaptive"}}),
                      Contains("adaptive") && Contains("static, dynamic or none"));
  REQUIRE_THROWS_WITH(loss_scale_from_state({{"scale", 2.0}}), Contains("\"kind\""));
  REQUIRE_THROWS_WITH(loss_scale_from_state({{"kind", 3}}), Contains("\"kind\""));
  REQUIRE_THROWS_WITH(loss_scale_from_state(nlohmann::json(5)), Contains("JSON object"));
  // A dynamic state with a bad field fails while building, naming the field.
  nlohmann::json state = DynamicLossScale().state_dict();
  state.erase("hysteresis_left");
  REQUIRE_THROWS_WITH(loss_scale_from_state(state), Contains("\"hysteresis_left\""));
}
