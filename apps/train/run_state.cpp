#include "apps/train/run_state.h"

#include <cmath>

#include "apps/checkpoint/tensor_json.h"
#include "apps/train/run_stats.h"
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
  shared.debug = defaults.debug;
  return to_yaml(shared);
}

nlohmann::json make_run_state(const TrainConfig& config, const RunPosition& position,
                              const Optimizer& optimizer, const GradScaler& scaler,
                              const Generator& dropout_gen) {
  const OptimizerState opt = optimizer.state_dict();
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
  MIXPREC_CHECK(fingerprint.is_string() && fingerprint.get<std::string>() ==
                                               resume_fingerprint(config),
                path, ": this checkpoint was written by a run with another config (model, data, "
                      "precision, loss scaling, optimizer, schedule, seed, batch size or "
                      "accumulation differ); resume it with the config.yaml of its run folder");
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
    MIXPREC_CHECK(losses.is_array() && losses.size() <= RunStats::kRecent, path,
                  ": 'recent_losses' must be an array of at most ", RunStats::kRecent,
                  " finite numbers, got ", json_excerpt(losses));
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
