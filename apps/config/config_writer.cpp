// to_yaml: every setting, defaults included, in the layout the reader expects. Real settings
// go through format_number, so that the file shows them as floats ("1.0", not "1") and they
// read back bit for bit.
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>

#include "apps/config/layer_kinds.h"
#include "apps/config/train_config.h"
#include "apps/config/yaml_values.h"
#include "core/error.h"

namespace mixprec {
namespace {

using config_loader::format_number;
using config_loader::LayerKindName;
using config_loader::layer_kind_entry;

void emit(YAML::Emitter& out, const char* key, const std::string& value) {
  out << YAML::Key << key << YAML::Value << value;
}
void emit(YAML::Emitter& out, const char* key, const char* value) {
  out << YAML::Key << key << YAML::Value << std::string(value);
}
void emit(YAML::Emitter& out, const char* key, int64_t value) {
  out << YAML::Key << key << YAML::Value << value;
}
void emit(YAML::Emitter& out, const char* key, uint64_t value) {
  out << YAML::Key << key << YAML::Value << value;
}
void emit(YAML::Emitter& out, const char* key, bool value) {
  out << YAML::Key << key << YAML::Value << value;
}
void emit_number(YAML::Emitter& out, const char* key, double value) {
  out << YAML::Key << key << YAML::Value << format_number(value);
}

void emit_layer(YAML::Emitter& out, const CnnLayerSpec& layer) {
  using Kind = CnnLayerSpec::Kind;
  const LayerKindName& entry = layer_kind_entry(layer.kind);
  if (!entry.takes_value) {
    out << std::string(entry.name);
    return;
  }
  out << YAML::Flow << YAML::BeginMap;
  switch (layer.kind) {
    case Kind::Conv:
      emit(out, "conv", layer.out);
      emit(out, "kernel", layer.kernel);
      emit(out, "padding", layer.padding);
      emit(out, "stride", layer.stride);
      emit(out, "bias", layer.bias);
      break;
    case Kind::MaxPool:
    case Kind::AvgPool:
      emit(out, entry.name, layer.kernel);
      emit(out, "stride", layer.stride);
      emit(out, "padding", layer.padding);
      break;
    case Kind::Linear:
      emit(out, "linear", layer.out);
      emit(out, "bias", layer.bias);
      break;
    case Kind::Dropout:
      emit_number(out, "dropout", layer.p);
      break;
    default:
      break;
  }
  out << YAML::EndMap;
}

}  // namespace

std::string to_yaml(const TrainConfig& config) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  emit(out, "name", config.name);

  out << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  if (config.model.type == ModelConfig::Type::Cnn) {
    const CnnSpec& cnn = config.model.cnn;
    emit(out, "type", "cnn");
    emit(out, "in_channels", cnn.in_channels);
    emit(out, "input_size", cnn.input_size);
    out << YAML::Key << "layers" << YAML::Value << YAML::BeginSeq;
    for (const CnnLayerSpec& layer : cnn.layers) emit_layer(out, layer);
    out << YAML::EndSeq;
  } else {
    const GptSpec& gpt = config.model.gpt;
    emit(out, "type", "gpt");
    emit(out, "vocab_size", gpt.vocab_size);
    emit(out, "block_size", gpt.block_size);
    emit(out, "n_layer", gpt.n_layer);
    emit(out, "n_head", gpt.n_head);
    emit(out, "n_embd", gpt.n_embd);
    emit_number(out, "dropout", gpt.dropout);
    emit(out, "bias", gpt.bias);
    emit(out, "tie_weights", gpt.tie_weights);
  }
  out << YAML::EndMap;

  const DataConfig& data = config.data;
  out << YAML::Key << "data" << YAML::Value << YAML::BeginMap;
  if (data.kind == DataConfig::Kind::Idx) {
    emit(out, "kind", "idx");
    emit(out, "train_images", data.train_images);
    emit(out, "train_labels", data.train_labels);
    emit(out, "test_images", data.test_images);
    emit(out, "test_labels", data.test_labels);
    emit(out, "num_classes", data.num_classes);
    if (data.mean || data.std) {
      out << YAML::Key << "normalize" << YAML::Value << YAML::Flow << YAML::BeginMap;
      if (data.mean) emit_number(out, "mean", *data.mean);
      if (data.std) emit_number(out, "std", *data.std);
      out << YAML::EndMap;
    }
    emit(out, "limit_train", data.limit_train);
    emit(out, "limit_test", data.limit_test);
  } else {
    emit(out, "kind", "text");
    emit(out, "path", data.path);
    emit_number(out, "val_fraction", data.val_fraction);
    emit(out, "eval_batches", data.eval_batches);
  }
  emit(out, "shuffle", data.shuffle);
  out << YAML::EndMap;

  emit(out, "precision", config.precision);
  emit(out, "tf32", config.tf32);

  const LossScaleConfig& scale = config.loss_scale;
  out << YAML::Key << "loss_scale" << YAML::Value << YAML::BeginMap;
  emit(out, "policy", scale.policy);
  emit_number(out, "init_scale", scale.init_scale);
  emit_number(out, "growth_factor", scale.growth_factor);
  emit_number(out, "backoff_factor", scale.backoff_factor);
  emit(out, "growth_interval", scale.growth_interval);
  emit(out, "hysteresis", scale.hysteresis);
  emit(out, "hysteresis_mode", scale.hysteresis_mode);
  emit_number(out, "min_scale", scale.min_scale);
  emit_number(out, "max_scale", scale.max_scale);
  emit(out, "floor_policy", scale.floor_policy);
  out << YAML::EndMap;

  const OptimizerConfig& optimizer = config.optimizer;
  out << YAML::Key << "optimizer" << YAML::Value << YAML::BeginMap;
  emit(out, "type", optimizer.type);
  emit_number(out, "lr", optimizer.lr);
  emit_number(out, "momentum", optimizer.momentum);
  emit(out, "nesterov", optimizer.nesterov);
  emit_number(out, "weight_decay", optimizer.weight_decay);
  out << YAML::Key << "betas" << YAML::Value << YAML::Flow << YAML::BeginSeq
      << format_number(optimizer.beta1) << format_number(optimizer.beta2) << YAML::EndSeq;
  emit_number(out, "eps", optimizer.eps);
  out << YAML::EndMap;

  const ScheduleConfig& schedule = config.schedule;
  out << YAML::Key << "schedule" << YAML::Value << YAML::BeginMap;
  emit(out, "type", schedule.type);
  emit(out, "step_size", schedule.step_size);
  emit_number(out, "gamma", schedule.gamma);
  emit(out, "warmup_steps", schedule.warmup_steps);
  emit(out, "decay_steps", schedule.decay_steps);
  emit_number(out, "min_lr", schedule.min_lr);
  out << YAML::EndMap;

  const TrainLoopConfig& train = config.train;
  out << YAML::Key << "train" << YAML::Value << YAML::BeginMap;
  emit(out, "epochs", train.epochs);
  emit(out, "steps", train.steps);
  emit(out, "batch_size", train.batch_size);
  emit(out, "accumulation_steps", train.accumulation_steps);
  emit_number(out, "clip_grad_norm", train.clip_grad_norm);
  emit(out, "seed", train.seed);
  emit(out, "eval_every", train.eval_every);
  emit(out, "log_every", train.log_every);
  emit(out, "max_consecutive_skips", train.max_consecutive_skips);
  emit(out, "host_reads", train.host_reads);
  emit(out, "cuda_graph", train.cuda_graph);
  out << YAML::EndMap;

  const CheckpointConfig& checkpoint = config.checkpoint;
  out << YAML::Key << "checkpoint" << YAML::Value << YAML::BeginMap;
  emit(out, "every", checkpoint.every);
  emit(out, "keep", checkpoint.keep);
  emit(out, "save_initial", checkpoint.save_initial);
  out << YAML::EndMap;

  emit(out, "device", config.device);

  const DistributedConfig& distributed = config.distributed;
  out << YAML::Key << "distributed" << YAML::Value << YAML::BeginMap;
  emit(out, "backend", distributed.backend);
  emit_number(out, "timeout_s", distributed.timeout_s);
  emit(out, "shard_optimizer", distributed.shard_optimizer);
  out << YAML::EndMap;

  out << YAML::Key << "log" << YAML::Value << YAML::BeginMap;
  emit(out, "tensorboard", config.log.tensorboard);
  out << YAML::EndMap;

  const DebugConfig& debug = config.debug;
  out << YAML::Key << "debug" << YAML::Value << YAML::BeginMap;
  emit(out, "detect_anomaly", debug.detect_anomaly);
  // Injection is off unless a step is set; "off" has no spelling of its own in the file.
  if (debug.inject_step >= 0) {
    out << YAML::Key << "inject_nonfinite" << YAML::Value << YAML::BeginMap;
    emit(out, "step", debug.inject_step);
    emit(out, "tensor", debug.inject_tensor);
    emit(out, "value", debug.inject_value);
    emit(out, "rank", debug.inject_rank);
    out << YAML::EndMap;
  }
  out << YAML::EndMap;

  out << YAML::EndMap;
  MIXPREC_CHECK(out.good(), "to_yaml: ", out.GetLastError());
  return std::string(out.c_str()) + "\n";
}

}  // namespace mixprec
