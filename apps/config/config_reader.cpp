// Each section is read whole, in the order of kRootKeys, so that a check across keys sees
// every value it compares: those of its own section, the precision for the loss scale, the
// optimizer's lr for the schedule.
#include "apps/config/config_reader.h"

#include <cstdint>
#include <string>
#include <system_error>
#include <utility>

#include "apps/config/key_reader.h"
#include "apps/config/layer_kinds.h"
#include "apps/config/suggest.h"
#include "apps/config/yaml_values.h"

namespace mixprec::config_loader {
namespace {

namespace fs = std::filesystem;

// Every integer setting has an upper bound too: far beyond any real run, but low enough that
// products of settings (batch_size * block_size, eval_batches * batch_size, ...) cannot
// overflow and a typo cannot ask for exabytes.
constexpr int64_t kMaxExtent = int64_t{1} << 20;    // sizes of layers, batches, windows
constexpr int64_t kMaxCount = int64_t{1} << 40;     // steps and other counts of events
constexpr int64_t kMaxInt32 = 2147483647;           // settings the scaler keeps as int

const std::vector<std::string> kRootKeys = {"name",      "model",      "data",     "precision",
                                            "tf32",      "loss_scale", "optimizer", "schedule",
                                            "train",     "checkpoint", "device",   "log",
                                            "debug",     "distributed"};
const std::vector<std::string> kCnnKeys = {"type", "in_channels", "input_size", "layers"};
const std::vector<std::string> kGptKeys = {"type",    "vocab_size", "block_size",
                                           "n_layer", "n_head",     "n_embd",
                                           "dropout", "bias",       "tie_weights"};
const std::vector<std::string> kIdxKeys = {
    "kind",        "train_images", "train_labels", "test_images", "test_labels",
    "num_classes", "normalize",    "limit_train",  "limit_test",  "shuffle"};
const std::vector<std::string> kTextKeys = {"kind", "path", "val_fraction", "eval_batches",
                                            "shuffle"};

class ConfigReader : KeyReader {
 public:
  ConfigReader(std::string origin, fs::path base_dir, std::vector<Override> overrides)
      : KeyReader(std::move(origin), std::move(overrides)), base_dir_(std::move(base_dir)) {}

  TrainConfig read(const YAML::Node& root, const std::string& default_name) const {
    TrainConfig config;
    check_keys(root, "", kRootKeys,
               {{{"dataset", "data"},
                 {"optim", "optimizer"},
                 {"scheduler", "schedule"},
                 {"lr_schedule", "schedule"},
                 {"training", "train"},
                 {"scaler", "loss_scale"},
                 {"loss_scaling", "loss_scale"},
                 {"amp", "precision"},
                 {"allow_tf32", "tf32"},
                 {"logging", "log"},
                 {"tensorboard", "log"}},
                {},
                ""});
    config.name = default_name;
    if (read_string(root, "", "name", config.name) && config.name.empty())
      fail(root["name"], "name", "name must not be empty");

    if (!present(root, "model"))
      fail(root, "", "the model section is missing (model: {type: cnn | gpt, ...})");
    read_model(section(root, "", "model"), "model", config.model);
    if (!present(root, "data"))
      fail(root, "", "the data section is missing (data: {train_images: ...} or {path: ...})");
    read_data(section(root, "", "data"), "data", config.data);

    read_choice(root, "", "precision", config.precision, {"fp32", "fp16", "bf16"});
    read_bool(root, "", "tf32", config.tf32);
    read_loss_scale(section(root, "", "loss_scale"), "loss_scale", config.precision,
                    config.loss_scale);
    read_optimizer(section(root, "", "optimizer"), "optimizer", config.optimizer);
    read_schedule(section(root, "", "schedule"), "schedule", config.optimizer.lr, config.schedule);
    read_train(section(root, "", "train"), "train", config.train);
    read_checkpoint(section(root, "", "checkpoint"), "checkpoint", config.checkpoint);
    read_choice(root, "", "device", config.device, {"cpu", "cuda", "auto"});
    read_log(section(root, "", "log"), "log", config.log);
    read_distributed(section(root, "", "distributed"), "distributed", config.distributed);
    read_debug(section(root, "", "debug"), "debug", config.debug);
    check_cuda_graph(root, config);
    return config;
  }

 private:
  void read_model(const YAML::Node& map, const std::string& path, ModelConfig& model) const {
    std::string type = "cnn";
    read_choice(map, path, "type", type, {"cnn", "gpt"});
    if (type == "cnn") {
      model.type = ModelConfig::Type::Cnn;
      check_keys(map, path, kCnnKeys,
                 {{{"channels", "in_channels"}, {"image_size", "input_size"}},
                  {kGptKeys.begin() + 1, kGptKeys.end()},
                  "a setting of type gpt, not cnn"});
      read_int(map, path, "in_channels", model.cnn.in_channels, IntRange::between(1, kMaxExtent));
      read_int(map, path, "input_size", model.cnn.input_size, IntRange::between(1, kMaxExtent));
      read_layers(map, path, model.cnn);
    } else {
      model.type = ModelConfig::Type::Gpt;
      check_keys(map, path, kGptKeys,
                 {{{"n_layers", "n_layer"},
                   {"n_heads", "n_head"},
                   {"d_model", "n_embd"},
                   {"context_length", "block_size"},
                   {"vocab", "vocab_size"}},
                  {kCnnKeys.begin() + 1, kCnnKeys.end()},
                  "a setting of type cnn, not gpt"});
      GptSpec& gpt = model.gpt;
      read_int(map, path, "vocab_size", gpt.vocab_size, IntRange::between(0, kMaxExtent));
      read_int(map, path, "block_size", gpt.block_size, IntRange::between(1, kMaxExtent));
      read_int(map, path, "n_layer", gpt.n_layer, IntRange::between(1, kMaxExtent));
      read_int(map, path, "n_head", gpt.n_head, IntRange::between(1, kMaxExtent));
      read_int(map, path, "n_embd", gpt.n_embd, IntRange::between(1, kMaxExtent));
      read_double(map, path, "dropout", gpt.dropout, DoubleRange::between(0.0, false, 1.0, true));
      read_bool(map, path, "bias", gpt.bias);
      read_bool(map, path, "tie_weights", gpt.tie_weights);
      if (gpt.n_embd % gpt.n_head != 0) {
        const std::string n_embd_path = join_key(path, "n_embd");
        fail(map["n_embd"].IsDefined() ? map["n_embd"] : map, n_embd_path,
             n_embd_path + " (" + std::to_string(gpt.n_embd) + ") must be divisible by " + path +
                 ".n_head (" + std::to_string(gpt.n_head) + ")");
      }
    }
  }

  void read_layers(const YAML::Node& map, const std::string& model_path, CnnSpec& cnn) const {
    const std::string path = join_key(model_path, "layers");
    const YAML::Node layers = map["layers"];
    if (!layers.IsDefined() || layers.IsNull())
      fail(map, model_path,
           path +
               " is missing: a cnn needs its list of layers, e.g. "
               "[{conv: 32}, relu, flatten, {linear: 10}]");
    if (!layers.IsSequence()) fail_type(layers, path, "a list of layers");
    if (layers.size() == 0) fail(layers, path, path + " must not be empty");
    cnn.layers.clear();
    for (size_t i = 0; i < layers.size(); ++i)
      cnn.layers.push_back(read_layer(layers[i], item_path(path, i)));
  }

  [[noreturn]] void fail_unknown_layer(const YAML::Node& node, const std::string& path,
                                       const std::string& name) const {
    std::string message = path + ": unknown layer '" + name + "'";
    if (const auto suggestion = closest_match(name, layer_kind_names()))
      message += " (did you mean '" + *suggestion + "'?)";
    else
      message += "; the layers are " + join_list(layer_kind_names());
    fail(node, path, message);
  }

  CnnLayerSpec read_layer(const YAML::Node& item, const std::string& path) const {
    using Kind = CnnLayerSpec::Kind;
    CnnLayerSpec layer;
    if (item.IsScalar()) {
      const std::string name = item.Scalar();
      const LayerKindName* kind = find_layer_kind(name);
      if (!kind) fail_unknown_layer(item, path, name);
      if (kind->takes_value)
        fail(item, path, path + ": layer '" + name + "' needs a value, as in " + kind->example);
      layer.kind = kind->kind;
      return layer;
    }
    if (!item.IsMap() || item.size() == 0)
      fail(item, path,
           path +
               ": expected a layer name such as relu or a map such as "
               "{conv: 32, kernel: 3}, got " +
               describe(item));

    // The first key names the kind; the rest are its options.
    const auto first = item.begin();
    if (!first->first.IsScalar()) fail_type(first->first, path, "a layer name as the first key");
    const std::string name = first->first.Scalar();
    const LayerKindName* kind = find_layer_kind(name);
    if (!kind) {
      for (auto it = item.begin(); it != item.end(); ++it)
        if (it->first.IsScalar() && find_layer_kind(it->first.Scalar()))
          fail(first->first, path,
               path + ": the first key of a layer names its kind, but '" + name +
                   "' comes before '" + it->first.Scalar() + "'");
      fail_unknown_layer(first->first, path, name);
    }
    layer.kind = kind->kind;
    const YAML::Node value = first->second;
    const std::string value_path = join_key(path, name);
    if (!kind->takes_value) {
      if (!value.IsNull() || item.size() != 1)
        fail(item, path,
             path + ": layer '" + name +
                 "' takes no value or options; write it "
                 "as '- " +
                 name + "'");
      return layer;
    }

    // An unknown key that is itself a layer kind is a layer written inside the wrong item.
    KeyHints hints{{}, {}, "a layer of its own: give each layer its own list item"};
    for (const std::string& other : layer_kind_names())
      if (other != name) hints.elsewhere.push_back(other);
    switch (layer.kind) {
      case Kind::Conv:
        check_keys(item, path, {"conv", "kernel", "padding", "stride", "bias"}, hints);
        layer.out = to_int(value, value_path);
        check_int(value, value_path, layer.out, IntRange::between(1, kMaxExtent));
        read_int(item, path, "kernel", layer.kernel, IntRange::between(1, kMaxExtent));
        read_int(item, path, "padding", layer.padding, IntRange::between(0, kMaxExtent));
        read_int(item, path, "stride", layer.stride, IntRange::between(1, kMaxExtent));
        read_bool(item, path, "bias", layer.bias);
        break;
      case Kind::MaxPool:
      case Kind::AvgPool: {
        check_keys(item, path, {name, "stride", "padding"}, hints);
        layer.kernel = to_int(value, value_path);
        check_int(value, value_path, layer.kernel, IntRange::between(1, kMaxExtent));
        layer.stride = layer.kernel;
        read_int(item, path, "stride", layer.stride, IntRange::between(1, kMaxExtent));
        read_int(item, path, "padding", layer.padding, IntRange::between(0, kMaxExtent));
        // PyTorch's rule: a window must always overlap the unpadded input.
        if (layer.padding > layer.kernel / 2)
          fail_range(item["padding"], join_key(path, "padding"),
                     "must be <= kernel / 2 = " + std::to_string(layer.kernel / 2));
        break;
      }
      case Kind::Linear:
        check_keys(item, path, {"linear", "bias"}, hints);
        layer.out = to_int(value, value_path);
        check_int(value, value_path, layer.out, IntRange::between(1, kMaxExtent));
        read_bool(item, path, "bias", layer.bias);
        break;
      case Kind::Dropout:
        check_keys(item, path, {"dropout"}, hints);
        layer.p = to_double(value, value_path);
        check_double(value, value_path, layer.p, DoubleRange::between(0.0, false, 1.0, true));
        break;
      default:
        break;
    }
    return layer;
  }

  // An existing file for a data path: absolute as given, relative against the config's
  // folder first and then the working directory.
  std::string resolve_data_path(const YAML::Node& node, const std::string& path,
                                const std::string& value) const {
    if (value.empty()) fail(node, path, path + " must not be empty");
    const fs::path given(value);
    std::error_code error;
    auto is_file = [&error](const fs::path& p) {
      return fs::exists(p, error) && !fs::is_directory(p, error);
    };
    if (given.is_absolute()) {
      if (is_file(given)) return given.lexically_normal().string();
      fail(node, path, path + ": file '" + value + "' not found");
    }
    const fs::path next_to_config = (base_dir_ / given).lexically_normal();
    const fs::path in_working_dir = (fs::current_path() / given).lexically_normal();
    if (is_file(next_to_config)) return next_to_config.string();
    if (is_file(in_working_dir)) return in_working_dir.string();
    fail(node, path,
         path + ": file '" + value + "' not found (looked for '" + next_to_config.string() +
             "' next to the config and for '" + in_working_dir.string() +
             "' in the working directory)");
  }

  void read_data_path(const YAML::Node& map, const std::string& map_path, const std::string& key,
                      const std::string& kind, std::string& out) const {
    const std::string path = join_key(map_path, key);
    const YAML::Node node = map[key];
    if (!node.IsDefined() || node.IsNull())
      fail(map, map_path, path + " is missing (required for kind " + kind + ")");
    out = resolve_data_path(node, path, to_string(node, path));
  }

  void read_data(const YAML::Node& map, const std::string& path, DataConfig& data) const {
    std::string kind;
    if (!read_choice(map, path, "kind", kind, {"idx", "text"})) {
      if (map["train_images"].IsDefined())
        kind = "idx";
      else if (map["path"].IsDefined())
        kind = "text";
      else
        fail(map, path,
             path +
                 " names no data: give train_images, train_labels, test_images "
                 "and test_labels (kind idx) or path (kind text)");
    }
    if (kind == "idx") {
      data.kind = DataConfig::Kind::Idx;
      check_keys(map, path, kIdxKeys,
                 {{{"num_labels", "num_classes"}, {"classes", "num_classes"}},
                  {kTextKeys.begin() + 1, kTextKeys.end() - 1},
                  "a setting of kind text, not idx"});
      read_data_path(map, path, "train_images", kind, data.train_images);
      read_data_path(map, path, "train_labels", kind, data.train_labels);
      read_data_path(map, path, "test_images", kind, data.test_images);
      read_data_path(map, path, "test_labels", kind, data.test_labels);
      read_int(map, path, "num_classes", data.num_classes, IntRange::between(2, kMaxExtent));
      const YAML::Node normalize = section(map, path, "normalize");
      const std::string normalize_path = join_key(path, "normalize");
      if (normalize.size() > 0) {
        check_keys(normalize, normalize_path, {"mean", "std"});
        for (const char* key : {"mean", "std"})
          if (!normalize[key].IsDefined())
            fail(normalize, normalize_path,
                 normalize_path + "." + key + " is missing: normalize needs both mean and std");
        double mean = 0.0, std = 1.0;
        read_double(normalize, normalize_path, "mean", mean, DoubleRange::finite());
        read_double(normalize, normalize_path, "std", std, DoubleRange::above(0.0));
        data.mean = mean;
        data.std = std;
      }
      read_int(map, path, "limit_train", data.limit_train, IntRange::between(0, kMaxCount));
      read_int(map, path, "limit_test", data.limit_test, IntRange::between(0, kMaxCount));
    } else {
      data.kind = DataConfig::Kind::CharText;
      check_keys(map, path, kTextKeys,
                 {{{"file", "path"}, {"val_split", "val_fraction"}},
                  {kIdxKeys.begin() + 1, kIdxKeys.end() - 1},
                  "a setting of kind idx, not text"});
      read_data_path(map, path, "path", kind, data.path);
      read_double(map, path, "val_fraction", data.val_fraction,
                  DoubleRange::between(0.0, true, 1.0, true));
      read_int(map, path, "eval_batches", data.eval_batches, IntRange::between(1, kMaxExtent));
    }
    read_bool(map, path, "shuffle", data.shuffle);
  }

  void read_loss_scale(const YAML::Node& map, const std::string& path, const std::string& precision,
                       LossScaleConfig& scale) const {
    check_keys(map, path,
               {"policy", "init_scale", "growth_factor", "backoff_factor", "growth_interval",
                "hysteresis", "hysteresis_mode", "min_scale", "max_scale", "floor_policy"},
               {{{"scale", "init_scale"},
                 {"initial_scale", "init_scale"},
                 {"type", "policy"},
                 {"kind", "policy"}},
                {},
                ""});
    read_choice(map, path, "policy", scale.policy, {"auto", "dynamic", "static", "none"});
    read_double(map, path, "init_scale", scale.init_scale, DoubleRange::above(0.0));
    read_double(map, path, "growth_factor", scale.growth_factor, DoubleRange::above(1.0));
    read_double(map, path, "backoff_factor", scale.backoff_factor,
                DoubleRange::between(0.0, true, 1.0, true));
    read_int(map, path, "growth_interval", scale.growth_interval, IntRange::between(1, kMaxInt32));
    read_int(map, path, "hysteresis", scale.hysteresis, IntRange::between(1, kMaxInt32));
    read_choice(map, path, "hysteresis_mode", scale.hysteresis_mode,
                {"reset_on_growth", "consecutive"});
    read_double(map, path, "min_scale", scale.min_scale, DoubleRange::above(0.0));
    read_double(map, path, "max_scale", scale.max_scale, DoubleRange::above(0.0));
    read_choice(map, path, "floor_policy", scale.floor_policy, {"clamp", "warn", "error"});

    const YAML::Node max_node = map["max_scale"].IsDefined() ? map["max_scale"] : map;
    const std::string max_path = join_key(path, "max_scale");
    if (scale.max_scale < scale.min_scale)
      fail(max_node, max_path,
           max_path + " (" + format_number(scale.max_scale) + ") must be >= " + path +
               ".min_scale (" + format_number(scale.min_scale) + ")");
    // A dynamic scale starts inside its own bounds.
    const bool dynamic = effective_loss_scale_policy(scale.policy, precision) == "dynamic";
    if (dynamic && (scale.init_scale < scale.min_scale || scale.init_scale > scale.max_scale)) {
      const YAML::Node init_node = map["init_scale"].IsDefined() ? map["init_scale"] : map;
      const std::string init_path = join_key(path, "init_scale");
      fail(init_node, init_path,
           init_path + " (" + format_number(scale.init_scale) + ") must lie within [min_scale, " +
               "max_scale] = [" + format_number(scale.min_scale) + ", " +
               format_number(scale.max_scale) + "] for a dynamic loss scale");
    }
  }

  void read_optimizer(const YAML::Node& map, const std::string& path,
                      OptimizerConfig& optimizer) const {
    check_keys(map, path, {"type", "lr", "momentum", "nesterov", "weight_decay", "betas", "eps"},
               {{{"learning_rate", "lr"},
                 {"beta1", "betas"},
                 {"beta2", "betas"},
                 {"epsilon", "eps"},
                 {"wd", "weight_decay"},
                 {"name", "type"}},
                {},
                ""});
    read_choice(map, path, "type", optimizer.type, {"sgd", "adam", "adamw"});
    read_double(map, path, "lr", optimizer.lr, DoubleRange::at_least(0.0));
    read_double(map, path, "momentum", optimizer.momentum, DoubleRange::at_least(0.0));
    read_bool(map, path, "nesterov", optimizer.nesterov);
    read_double(map, path, "weight_decay", optimizer.weight_decay, DoubleRange::at_least(0.0));
    const YAML::Node betas = map["betas"];
    if (betas.IsDefined()) {
      const std::string betas_path = join_key(path, "betas");
      if (!betas.IsSequence() || betas.size() != 2)
        fail_type(betas, betas_path, "a list of two numbers [beta1, beta2]");
      double* targets[2] = {&optimizer.beta1, &optimizer.beta2};
      for (size_t i = 0; i < 2; ++i) {
        const std::string beta_path = item_path(betas_path, i);
        *targets[i] = to_double(betas[i], beta_path);
        check_double(betas[i], beta_path, *targets[i], DoubleRange::between(0.0, false, 1.0, true));
      }
    }
    read_double(map, path, "eps", optimizer.eps, DoubleRange::above(0.0));
    // torch.optim.SGD refuses Nesterov momentum without momentum; say so before the run.
    if (optimizer.type == "sgd" && optimizer.nesterov && optimizer.momentum <= 0.0) {
      const std::string nesterov_path = join_key(path, "nesterov");
      fail(map["nesterov"], nesterov_path,
           nesterov_path + ": Nesterov momentum needs " + path + ".momentum > 0, got " +
               format_number(optimizer.momentum));
    }
  }

  void read_schedule(const YAML::Node& map, const std::string& path, double base_lr,
                     ScheduleConfig& schedule) const {
    check_keys(map, path, {"type", "step_size", "gamma", "warmup_steps", "decay_steps", "min_lr"},
               {{{"warmup", "warmup_steps"}, {"decay", "decay_steps"}, {"name", "type"}}, {}, ""});
    read_choice(map, path, "type", schedule.type, {"constant", "step", "cosine"});
    read_int(map, path, "step_size", schedule.step_size, IntRange::between(1, kMaxCount));
    read_double(map, path, "gamma", schedule.gamma, DoubleRange::between(0.0, true, 1.0, false));
    read_int(map, path, "warmup_steps", schedule.warmup_steps, IntRange::between(0, kMaxCount));
    read_int(map, path, "decay_steps", schedule.decay_steps, IntRange::between(0, kMaxCount));
    read_double(map, path, "min_lr", schedule.min_lr, DoubleRange::at_least(0.0));
    if (schedule.type != "cosine") return;
    if (schedule.decay_steps > 0 && schedule.decay_steps < schedule.warmup_steps) {
      const std::string decay_path = join_key(path, "decay_steps");
      fail(map["decay_steps"], decay_path,
           decay_path + " (" + std::to_string(schedule.decay_steps) + ") must be 0 (the whole " +
               "run) or >= " + path + ".warmup_steps (" + std::to_string(schedule.warmup_steps) +
               ")");
    }
    if (schedule.min_lr > base_lr) {
      const std::string min_path = join_key(path, "min_lr");
      fail(map["min_lr"], min_path,
           min_path + " (" + format_number(schedule.min_lr) + ") must be <= optimizer.lr (" +
               format_number(base_lr) + ")");
    }
  }

  void read_train(const YAML::Node& map, const std::string& path, TrainLoopConfig& train) const {
    check_keys(map, path,
               {"epochs", "steps", "batch_size", "accumulation_steps", "clip_grad_norm", "seed",
                "eval_every", "log_every", "max_consecutive_skips", "host_reads", "cuda_graph"},
               {{{"num_epochs", "epochs"},
                 {"max_steps", "steps"},
                 {"max_iters", "steps"},
                 {"batch", "batch_size"},
                 {"grad_accumulation", "accumulation_steps"},
                 {"gradient_accumulation_steps", "accumulation_steps"},
                 {"grad_clip", "clip_grad_norm"},
                 {"max_grad_norm", "clip_grad_norm"},
                 {"max_skips", "max_consecutive_skips"},
                 {"max_skipped_steps", "max_consecutive_skips"}},
                {},
                ""});
    const bool epochs_given =
        read_int(map, path, "epochs", train.epochs, IntRange::between(0, kMaxExtent));
    const bool steps_given =
        read_int(map, path, "steps", train.steps, IntRange::between(0, kMaxCount));
    // A config that names neither runs one epoch, so that the train section stays optional.
    if (!epochs_given && !steps_given) train.epochs = 1;
    if ((train.epochs > 0) == (train.steps > 0)) {
      const YAML::Node at = map["steps"].IsDefined() ? map["steps"] : map["epochs"];
      const std::string at_path = join_key(path, map["steps"].IsDefined() ? "steps" : "epochs");
      fail(at.IsDefined() ? at : map, at_path,
           "exactly one of " + path + ".epochs and " + path + ".steps must be > 0, got epochs " +
               std::to_string(train.epochs) + " and steps " + std::to_string(train.steps));
    }
    read_int(map, path, "batch_size", train.batch_size, IntRange::between(1, kMaxExtent));
    read_int(map, path, "accumulation_steps", train.accumulation_steps,
             IntRange::between(1, kMaxExtent));
    read_double(map, path, "clip_grad_norm", train.clip_grad_norm, DoubleRange::at_least(0.0));
    const YAML::Node seed = map["seed"];
    if (seed.IsDefined()) train.seed = to_uint(seed, join_key(path, "seed"));
    read_int(map, path, "eval_every", train.eval_every, IntRange::between(0, kMaxCount));
    read_int(map, path, "log_every", train.log_every, IntRange::between(1, kMaxCount));
    read_int(map, path, "max_consecutive_skips", train.max_consecutive_skips,
             IntRange::between(0, kMaxCount));
    read_choice(map, path, "host_reads", train.host_reads, {"auto", "per_step", "at_log"});
    read_bool(map, path, "cuda_graph", train.cuda_graph);
  }

  // train.cuda_graph records the deferred step once per window between host reads on a GPU:
  // settings that make every window one step, or that read the device every step, are
  // refused with it.
  void check_cuda_graph(const YAML::Node& root, const TrainConfig& config) const {
    if (!config.train.cuda_graph) return;
    const YAML::Node at = section(root, "", "train")["cuda_graph"];
    const std::string why = "train.cuda_graph records the deferred step on a GPU";
    if (config.train.host_reads == "per_step")
      fail(at, "train.cuda_graph", why + " once per window of steps between host reads, "
                                   "which train.host_reads: per_step makes one step long; use "
                                   "host_reads: at_log or auto");
    if (config.device == "cpu")
      fail(at, "train.cuda_graph", why + "; device: cpu has none (use device: cuda or auto)");
    if (config.debug.detect_anomaly)
      fail(at, "train.cuda_graph", why + ", and debug.detect_anomaly reads every step's "
                                   "tensors on the host; switch one of them off");
  }

  void read_checkpoint(const YAML::Node& map, const std::string& path,
                       CheckpointConfig& checkpoint) const {
    check_keys(map, path, {"every", "keep", "save_initial"},
               {{{"keep_last", "keep"}, {"interval", "every"}}, {}, ""});
    read_int(map, path, "every", checkpoint.every, IntRange::between(0, kMaxCount));
    read_int(map, path, "keep", checkpoint.keep, IntRange::between(0, kMaxCount));
    read_bool(map, path, "save_initial", checkpoint.save_initial);
  }

  void read_distributed(const YAML::Node& map, const std::string& path,
                        DistributedConfig& distributed) const {
    check_keys(map, path, {"backend", "timeout_s", "shard_optimizer"},
               {{{"timeout", "timeout_s"}, {"zero", "shard_optimizer"}}, {}, ""});
    read_choice(map, path, "backend", distributed.backend, {"auto", "none", "mpi", "nccl"});
    read_double(map, path, "timeout_s", distributed.timeout_s, DoubleRange::above(0.0));
    read_bool(map, path, "shard_optimizer", distributed.shard_optimizer);
  }

  void read_log(const YAML::Node& map, const std::string& path, LogConfig& log) const {
    check_keys(map, path, {"tensorboard"}, {{{"tb", "tensorboard"}}, {}, ""});
    read_bool(map, path, "tensorboard", log.tensorboard);
  }

  void read_debug(const YAML::Node& map, const std::string& path, DebugConfig& debug) const {
    check_keys(map, path, {"detect_anomaly", "inject_nonfinite"},
               {{{"anomaly", "detect_anomaly"}}, {}, ""});
    read_bool(map, path, "detect_anomaly", debug.detect_anomaly);
    const YAML::Node inject = section(map, path, "inject_nonfinite");
    if (inject.size() == 0) return;
    const std::string inject_path = join_key(path, "inject_nonfinite");
    check_keys(inject, inject_path, {"step", "tensor", "value", "rank"});
    for (const char* key : {"step", "tensor"})
      if (!present(inject, key))
        fail(inject, inject_path,
             inject_path + "." + key +
                 " is missing: injection needs the "
                 "step and the tensor (a parameter name, loss or input)");
    read_int(inject, inject_path, "step", debug.inject_step, IntRange::between(1, kMaxCount));
    read_string(inject, inject_path, "tensor", debug.inject_tensor);
    if (debug.inject_tensor.empty())
      fail(inject["tensor"], inject_path + ".tensor", inject_path + ".tensor must not be empty");
    read_choice(inject, inject_path, "value", debug.inject_value, {"inf", "nan"});
    read_int(inject, inject_path, "rank", debug.inject_rank, IntRange::between(-1, kMaxExtent));
  }

  fs::path base_dir_;
};

}  // namespace

TrainConfig read_train_config(const YAML::Node& root, const std::string& origin,
                              const std::filesystem::path& base_dir,
                              std::vector<Override> overrides, const std::string& default_name) {
  return ConfigReader(origin, base_dir, std::move(overrides)).read(root, default_name);
}

}  // namespace mixprec::config_loader
