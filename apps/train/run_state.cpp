#include "apps/train/run_state.h"

#include <yaml-cpp/yaml.h>

#include <cmath>

#include "apps/checkpoint/tensor_json.h"
#include "core/error.h"

namespace mixprec {

namespace {
constexpr const char* kFormat = "mixprec-run-state-1";
// A state.json is 4 levels deep (optimizer.scalars.params[i]); restoring copies and prints
// parts of it, which recurses once per level, so a deeper file is refused before that.
constexpr int kMaxDepth = 32;
}

std::string resume_fingerprint(const TrainConfig& config) {
  // Settings that only change how long or how visibly a run goes are reset to defaults,
  // the rest must match.
  TrainConfig shared = config;
  const TrainConfig defaults;
  shared.source_path.clear();
  shared.name.clear();
  shared.train.epochs = defaults.train.epochs;
  shared.train.steps = defaults.train.steps;
  shared.train.eval_every = defaults.train.eval_every;
  shared.train.log_every = defaults.train.log_every;
  shared.train.max_consecutive_skips = defaults.train.max_consecutive_skips;
  shared.train.host_reads = defaults.train.host_reads;  // the same steps either way
  shared.train.cuda_graph = defaults.train.cuda_graph;  // likewise
  shared.checkpoint = defaults.checkpoint;
  shared.device = defaults.device;
  shared.log = defaults.log;
  shared.debug = defaults.debug;
  return to_yaml(shared);
}

namespace {

// `map`'s entry `key`, or an undefined node (which, unlike yaml-cpp's look-up of a missing
// key in a const node, may still be asked anything).
YAML::Node entry_of(const YAML::Node& map, const std::string& key) {
  if (map.IsDefined() && map.IsMap()) {
    for (const auto& entry : map)
      if (entry.first.as<std::string>() == key) return entry.second;
  }
  return YAML::Node(YAML::NodeType::Undefined);
}

void fingerprint_differences(const YAML::Node& stored, const YAML::Node& current,
                             const YAML::Node& defaults, const std::string& path,
                             std::vector<std::string>& out);

// fingerprint_differences of two maps, key by key.
void map_differences(const YAML::Node& stored, const YAML::Node& current,
                     const YAML::Node& defaults, const std::string& path,
                     std::vector<std::string>& out) {
  const auto child = [&](const std::string& key) { return path.empty() ? key : path + "." + key; };
  for (const auto& entry : current) {
    const std::string key = entry.first.as<std::string>();
    const YAML::Node old = entry_of(stored, key);
    const YAML::Node fallback = entry_of(defaults, key);
    if (old.IsDefined()) {
      fingerprint_differences(old, entry.second, fallback, child(key), out);
    } else if (!fallback.IsDefined() || YAML::Dump(fallback) != YAML::Dump(entry.second)) {
      out.push_back(child(key));
    }
  }
  for (const auto& entry : stored) {  // a setting this mixprec no longer has
    const std::string key = entry.first.as<std::string>();
    if (!entry_of(current, key).IsDefined()) out.push_back(child(key));
  }
}

// Appends to `out` the dotted paths where the fingerprint trees `stored` (a checkpoint's) and
// `current` (this run's) differ. A key only `current` has is a setting added to mixprec after
// the checkpoint was written: it differs only when this run moves it from its default (the
// same path in `defaults`, a default TrainConfig's fingerprint), so checkpoints of earlier
// versions resume as long as the run leaves new settings alone.
void fingerprint_differences(const YAML::Node& stored, const YAML::Node& current,
                             const YAML::Node& defaults, const std::string& path,
                             std::vector<std::string>& out) {
  if (!stored.IsDefined() || !current.IsDefined()) {
    if (stored.IsDefined() != current.IsDefined()) out.push_back(path);
    return;
  }
  if (stored.IsMap() && current.IsMap()) {
    map_differences(stored, current, defaults, path, out);
    return;
  }
  if (stored.IsSequence() && current.IsSequence() && stored.size() == current.size()) {
    for (size_t i = 0; i < current.size(); ++i) {
      const YAML::Node fallback = defaults.IsDefined() && defaults.IsSequence() &&
                                          i < defaults.size()
                                      ? defaults[i]
                                      : YAML::Node(YAML::NodeType::Undefined);
      fingerprint_differences(stored[i], current[i], fallback,
                              path + "[" + std::to_string(i) + "]", out);
    }
    return;
  }
  if (YAML::Dump(stored) != YAML::Dump(current)) out.push_back(path);
}

}  // namespace

std::vector<std::string> fingerprint_differences(const std::string& stored,
                                                 const TrainConfig& config) {
  YAML::Node old;
  try {
    old = YAML::Load(stored);
  } catch (const YAML::Exception&) {
    return {"(the checkpoint's fingerprint is not YAML)"};
  }
  const TrainConfig defaults;
  std::vector<std::string> out;
  fingerprint_differences(old, YAML::Load(resume_fingerprint(config)),
                          YAML::Load(resume_fingerprint(defaults)), "", out);
  return out;
}

nlohmann::json make_run_state(const TrainConfig& config, const RunPosition& position,
                              const Optimizer& optimizer, const GradScaler& scaler,
                              const Generator& dropout_gen) {
  return make_run_state(config, position, optimizer.state_dict(), scaler, dropout_gen);
}

nlohmann::json make_run_state(const TrainConfig& config, const RunPosition& position,
                              const OptimizerState& opt, const GradScaler& scaler,
                              const Generator& dropout_gen) {
  nlohmann::json tensors = nlohmann::json::object();
  for (const auto& [name, tensor] : opt.tensors) tensors[name] = tensor_to_json(tensor);
  return nlohmann::json{
      {"format", kFormat},
      {"step", position.step},
      {"next_batch", position.next_batch},
      {"skipped_steps", position.skipped_steps},
      {"train_seconds", position.train_seconds},
      {"schedule_steps", position.schedule_steps},
      {"recent_losses", position.recent_losses},
      {"optimizer", {{"scalars", opt.scalars}, {"tensors", tensors}}},
      {"scaler", scaler.state_dict()},
      {"dropout_generator", {{"seed", dropout_gen.seed()}, {"offset", dropout_gen.offset()}}},
      {"fingerprint", resume_fingerprint(config)},
      {"config", to_yaml(config)},
  };
}

namespace {

const nlohmann::json& field(const nlohmann::json& object, const char* key,
                            const std::string& path) {
  MIXPREC_CHECK(object.is_object() && object.contains(key), path, ": state.json has no '", key,
                "'");
  return object.at(key);
}

int64_t integer_field(const nlohmann::json& object, const char* key, const std::string& path) {
  const nlohmann::json& value = field(object, key, path);
  MIXPREC_CHECK(value.is_number_integer() && value.get<int64_t>() >= 0, path, ": '", key,
                "' must be a non-negative integer, got ", json_excerpt(value));
  return value.get<int64_t>();
}

uint64_t unsigned_field(const nlohmann::json& object, const char* key, const std::string& path) {
  const nlohmann::json& value = field(object, key, path);
  MIXPREC_CHECK(value.is_number_unsigned() || (value.is_number_integer() && value.get<int64_t>() >= 0),
                path, ": '", key, "' must be a non-negative integer, got ", json_excerpt(value));
  return value.get<uint64_t>();
}

}  // namespace

RunPosition restore_run_state(const nlohmann::json& state, const std::string& path,
                              const TrainConfig& config, Optimizer& optimizer,
                              GradScaler& scaler, Generator& dropout_gen) {
  MIXPREC_CHECK(state.is_object(), path, ": state.json is not a JSON object");
  MIXPREC_CHECK(json_nested_within(state, kMaxDepth), path, ": state.json nests arrays or objects "
                "more than ", kMaxDepth, " levels deep");
  const nlohmann::json& format = field(state, "format", path);
  MIXPREC_CHECK(format == kFormat, path, ": state.json has format ", json_excerpt(format),
                ", expected \"", kFormat, "\"");
  const nlohmann::json& fingerprint = field(state, "fingerprint", path);
  MIXPREC_CHECK(fingerprint.is_string(), path, ": 'fingerprint' must be a string, got ",
                json_excerpt(fingerprint));
  const std::vector<std::string> differ =
      fingerprint_differences(fingerprint.get<std::string>(), config);
  if (!differ.empty()) {
    std::string listed;
    for (size_t i = 0; i < differ.size() && i < 6; ++i) listed += (i ? ", " : "") + differ[i];
    if (differ.size() > 6) listed += ", ...";
    MIXPREC_FAIL(path, ": this checkpoint was written by a run with another config (", listed,
                 " differ); resume it with the config.yaml of its run folder");
  }
  RunPosition position;
  position.step = integer_field(state, "step", path);
  position.next_batch = integer_field(state, "next_batch", path);
  position.skipped_steps = integer_field(state, "skipped_steps", path);
  position.schedule_steps = integer_field(state, "schedule_steps", path);
  const nlohmann::json& seconds = field(state, "train_seconds", path);
  MIXPREC_CHECK(seconds.is_number(), path, ": 'train_seconds' must be a number");
  position.train_seconds = seconds.get<double>();
  if (state.contains("recent_losses")) {
    const nlohmann::json& losses = state.at("recent_losses");
    // Any length: RunStats keeps the last kRecent, whatever window wrote them.
    MIXPREC_CHECK(losses.is_array(), path,
                  ": 'recent_losses' must be an array of finite numbers, got ",
                  json_excerpt(losses));
    for (const nlohmann::json& loss : losses) {
      MIXPREC_CHECK(loss.is_number() && std::isfinite(loss.get<double>()), path,
                    ": 'recent_losses' must hold finite numbers, got ", json_excerpt(loss));
      position.recent_losses.push_back(loss.get<double>());
    }
  }

  const nlohmann::json& opt = field(state, "optimizer", path);
  OptimizerState opt_state;
  opt_state.scalars = field(opt, "scalars", path);
  const nlohmann::json& tensors = field(opt, "tensors", path);
  MIXPREC_CHECK(tensors.is_object(), path, ": optimizer.tensors must be an object");
  for (const auto& [name, value] : tensors.items()) {
    opt_state.tensors.emplace_back(name, tensor_from_json(value, path + ": optimizer." + name));
  }
  const nlohmann::json& generator = field(state, "dropout_generator", path);
  const uint64_t seed = unsigned_field(generator, "seed", path);
  const uint64_t offset = unsigned_field(generator, "offset", path);
  const nlohmann::json& scaler_state = field(state, "scaler", path);

  // Optimizer first: it checks everything before writing. The scaler's load has the same
  // guarantee; if it fails after the optimizer was restored the caller throws the whole run
  // away, so nothing half-restored is used.
  try {
    optimizer.load_state_dict(opt_state);
    scaler.load_state_dict(scaler_state);
  } catch (const Error& e) {
    MIXPREC_FAIL(path, ": ", e.what());
  }
  dropout_gen.set_state(seed, offset);
  return position;
}

}  // namespace mixprec
