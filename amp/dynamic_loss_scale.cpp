#include "amp/dynamic_loss_scale.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/error.h"

namespace mixprec {
namespace {

// Shortest text that reads back as the same double, so a message never shows "1" for
// 1.0000000001.
std::string format_number(double value) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

void check_finite(const char* name, double value) {
  MIXPREC_CHECK(std::isfinite(value), "DynamicLossScale: ", name, " must be finite, got ",
                format_number(value));
}

DynamicScaleRule rule_from(const DynamicLossScaleOptions& options) {
  DynamicScaleRule rule;
  rule.growth_factor = options.growth_factor;
  rule.backoff_factor = options.backoff_factor;
  rule.growth_interval = options.growth_interval;
  rule.hysteresis = options.hysteresis;
  rule.hysteresis_mode = options.hysteresis_mode;
  rule.min_scale = options.min_scale;
  rule.max_scale = options.max_scale;
  return rule;
}

// ---- reading a state_dict ---------------------------------------------------------------

constexpr const char* kStateContext = "DynamicLossScale state";

const nlohmann::json& field(const nlohmann::json& state, const char* name) {
  const auto it = state.find(name);
  MIXPREC_CHECK(it != state.end(), kStateContext, ": missing field \"", name, "\"");
  return *it;
}

double number_field(const nlohmann::json& state, const char* name) {
  const nlohmann::json& value = field(state, name);
  MIXPREC_CHECK(value.is_number(), kStateContext, ": field \"", name, "\" must be a number, "
                "got ", value.type_name());
  return value.get<double>();
}

int int_field(const nlohmann::json& state, const char* name) {
  const nlohmann::json& value = field(state, name);
  MIXPREC_CHECK(value.is_number_integer(), kStateContext, ": field \"", name, "\" must be an "
                "integer, got ", value.is_number() ? "a non-integer number" : value.type_name());
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  constexpr int64_t kMin = std::numeric_limits<int32_t>::min();
  if (value.is_number_unsigned()) {
    const uint64_t unsigned_value = value.get<uint64_t>();
    MIXPREC_CHECK(unsigned_value <= static_cast<uint64_t>(kMax), kStateContext, ": field \"",
                  name, "\" = ", unsigned_value, " does not fit a 32-bit integer");
    return static_cast<int>(unsigned_value);
  }
  const int64_t signed_value = value.get<int64_t>();
  MIXPREC_CHECK(signed_value >= kMin && signed_value <= kMax, kStateContext, ": field \"", name,
                "\" = ", signed_value, " does not fit a 32-bit integer");
  return static_cast<int>(signed_value);
}

std::string string_field(const nlohmann::json& state, const char* name) {
  const nlohmann::json& value = field(state, name);
  MIXPREC_CHECK(value.is_string(), kStateContext, ": field \"", name, "\" must be a string, "
                "got ", value.type_name());
  return value.get<std::string>();
}

}  // namespace

void validate(const DynamicLossScaleOptions& o) {
  check_finite("init_scale", o.init_scale);
  check_finite("growth_factor", o.growth_factor);
  check_finite("backoff_factor", o.backoff_factor);
  check_finite("min_scale", o.min_scale);
  check_finite("max_scale", o.max_scale);
  MIXPREC_CHECK(o.growth_factor > 1.0, "DynamicLossScale: growth_factor must be > 1, got ",
                format_number(o.growth_factor), "; a factor <= 1 never grows the scale (the "
                "usual value is 2)");
  MIXPREC_CHECK(o.backoff_factor > 0.0 && o.backoff_factor < 1.0, "DynamicLossScale: "
                "backoff_factor must be > 0 and < 1, got ", format_number(o.backoff_factor),
                "; it multiplies the scale after an overflow (the usual value is 0.5)");
  MIXPREC_CHECK(o.growth_interval >= 1, "DynamicLossScale: growth_interval must be >= 1, got ",
                o.growth_interval, "; it counts the finite steps before a growth (the usual "
                "value is 2000)");
  MIXPREC_CHECK(o.hysteresis >= 1, "DynamicLossScale: hysteresis must be >= 1, got ",
                o.hysteresis, "; 1 backs off on every overflow");
  MIXPREC_CHECK(o.hysteresis_mode == HysteresisMode::ResetOnGrowth ||
                    o.hysteresis_mode == HysteresisMode::Consecutive,
                "DynamicLossScale: hysteresis_mode has the invalid value ",
                static_cast<int>(o.hysteresis_mode), "; use reset_on_growth or consecutive");
  MIXPREC_CHECK(o.floor_policy == FloorPolicy::Clamp || o.floor_policy == FloorPolicy::Warn ||
                    o.floor_policy == FloorPolicy::Error,
                "DynamicLossScale: floor_policy has the invalid value ",
                static_cast<int>(o.floor_policy), "; use clamp, warn or error");
  MIXPREC_CHECK(o.min_scale > 0.0, "DynamicLossScale: min_scale must be > 0, got ",
                format_number(o.min_scale), "; a scale of 0 erases every gradient");
  MIXPREC_CHECK(o.min_scale <= o.init_scale, "DynamicLossScale: min_scale must be <= "
                "init_scale, got min_scale ", format_number(o.min_scale), " > init_scale ",
                format_number(o.init_scale), "; lower min_scale or raise init_scale");
  MIXPREC_CHECK(o.init_scale <= o.max_scale, "DynamicLossScale: init_scale must be <= "
                "max_scale, got init_scale ", format_number(o.init_scale), " > max_scale ",
                format_number(o.max_scale), "; lower init_scale or raise max_scale");
}

DynamicLossScale::DynamicLossScale(DynamicLossScaleOptions options) : options_(options) {
  validate(options_);
  rule_ = rule_from(options_);
  state_.scale = options_.init_scale;
  state_.growth_tracker = 0;
  state_.hysteresis_left = options_.hysteresis;
}

ScaleChange DynamicLossScale::update(bool found_inf) {
  ScaleChange change;
  change.before = state_.scale;
  change.event = update_dynamic_scale(rule_, state_, found_inf);
  change.after = state_.scale;
  return change;
}

nlohmann::json DynamicLossScale::state_dict() const {
  return {
      {"kind", kind()},
      {"init_scale", options_.init_scale},
      {"growth_factor", options_.growth_factor},
      {"backoff_factor", options_.backoff_factor},
      {"growth_interval", options_.growth_interval},
      {"hysteresis", options_.hysteresis},
      {"hysteresis_mode", hysteresis_mode_name(options_.hysteresis_mode)},
      {"min_scale", options_.min_scale},
      {"max_scale", options_.max_scale},
      {"floor_policy", floor_policy_name(options_.floor_policy)},
      {"scale", state_.scale},
      {"growth_tracker", state_.growth_tracker},
      {"hysteresis_left", state_.hysteresis_left},
  };
}

// Everything is read and checked into locals first; the members are assigned only once
// the whole state is known to be valid, so a failed load leaves the policy as it was.
void DynamicLossScale::load_state_dict(const nlohmann::json& state) {
  MIXPREC_CHECK(state.is_object(), kStateContext, " must be a JSON object, got ",
                state.type_name());
  const std::string kind = string_field(state, "kind");
  MIXPREC_CHECK(kind == "dynamic", "DynamicLossScale cannot load a \"", kind, "\" loss-scale "
                "state; build the policy from the state with loss_scale_from_state instead");

  DynamicLossScaleOptions options;
  options.init_scale = number_field(state, "init_scale");
  options.growth_factor = number_field(state, "growth_factor");
  options.backoff_factor = number_field(state, "backoff_factor");
  options.growth_interval = int_field(state, "growth_interval");
  options.hysteresis = int_field(state, "hysteresis");
  options.hysteresis_mode = parse_hysteresis_mode(string_field(state, "hysteresis_mode"));
  options.min_scale = number_field(state, "min_scale");
  options.max_scale = number_field(state, "max_scale");
  options.floor_policy = parse_floor_policy(string_field(state, "floor_policy"));
  try {
    validate(options);
  } catch (const Error& error) {
    MIXPREC_FAIL(kStateContext, " holds invalid settings: ", error.what());
  }

  DynamicScaleState loaded;
  loaded.scale = number_field(state, "scale");
  loaded.growth_tracker = int_field(state, "growth_tracker");
  loaded.hysteresis_left = int_field(state, "hysteresis_left");
  MIXPREC_CHECK(std::isfinite(loaded.scale) && loaded.scale >= options.min_scale &&
                    loaded.scale <= options.max_scale,
                kStateContext, ": scale must be finite and within [min_scale, max_scale] = [",
                format_number(options.min_scale), ", ", format_number(options.max_scale),
                "], got ", format_number(loaded.scale));
  // The rule resets the tracker when it reaches growth_interval and never spends the last
  // tolerated overflow, so these are the only values a real trajectory produces.
  MIXPREC_CHECK(loaded.growth_tracker >= 0 && loaded.growth_tracker < options.growth_interval,
                kStateContext, ": growth_tracker must be within [0, growth_interval) = [0, ",
                options.growth_interval, "), got ", loaded.growth_tracker);
  MIXPREC_CHECK(loaded.hysteresis_left >= 1 && loaded.hysteresis_left <= options.hysteresis,
                kStateContext, ": hysteresis_left must be within [1, hysteresis] = [1, ",
                options.hysteresis, "], got ", loaded.hysteresis_left);

  options_ = options;
  rule_ = rule_from(options);
  state_ = loaded;
}

std::unique_ptr<LossScalePolicy> DynamicLossScale::clone() const {
  return std::make_unique<DynamicLossScale>(*this);
}

}  // namespace mixprec
