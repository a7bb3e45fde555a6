#include "apps/train/training_setup.h"

#include <algorithm>

#include "amp/dynamic_loss_scale.h"
#include "amp/no_loss_scale.h"
#include "amp/static_loss_scale.h"
#include "apps/data/char_text.h"
#include "apps/data/image_data.h"
#include "core/backend.h"
#include "core/error.h"
#include "layers/model_builder.h"
#include "optim/adam.h"
#include "optim/sgd.h"

namespace mixprec {

Device resolve_device(const std::string& device) {
  if (device == "cpu") return kCPU;
  const bool cuda = has_backend(DeviceType::CUDA);
  if (device == "auto") return cuda ? cuda_device(0) : kCPU;
  MIXPREC_CHECK(device == "cuda", "device: expected cpu, cuda or auto, got '", device, "'");
  MIXPREC_CHECK(cuda, "device: cuda was asked for, but no CUDA device is usable here (`mixprec "
                      "device` says why); use device: cpu or device: auto");
  return cuda_device(0);
}

std::unique_ptr<BatchSource> make_batch_source(const TrainConfig& config) {
  const DataConfig& data = config.data;
  if (data.kind == DataConfig::Kind::Idx) {
    ImageDataOptions options;
    options.train_images = data.train_images;
    options.train_labels = data.train_labels;
    options.test_images = data.test_images;
    options.test_labels = data.test_labels;
    options.num_classes = data.num_classes;
    options.mean = data.mean;
    options.std = data.std;
    options.batch_size = config.train.batch_size;
    options.shuffle = data.shuffle;
    options.seed = config.train.seed;
    options.limit_train = data.limit_train;
    options.limit_test = data.limit_test;
    return load_image_data(options);
  }
  CharTextOptions options;
  options.path = data.path;
  options.val_fraction = data.val_fraction;
  options.block_size = config.model.gpt.block_size;
  options.batch_size = config.train.batch_size;
  options.seed = config.train.seed;
  options.shuffle = data.shuffle;
  options.eval_batches = data.eval_batches;
  return load_char_text(options);
}

std::shared_ptr<Module> make_model(const TrainConfig& config, int64_t data_classes, Generator& init,
                                   std::shared_ptr<Generator> dropout_gen, Device device) {
  if (config.model.type == ModelConfig::Type::Cnn) {
    return build_cnn(config.model.cnn, init, std::move(dropout_gen), device);
  }
  GptSpec spec = config.model.gpt;
  if (spec.vocab_size == 0) {
    spec.vocab_size = data_classes;
  } else {
    MIXPREC_CHECK(spec.vocab_size >= data_classes, "model.vocab_size is ", spec.vocab_size,
                  " but the data has ", data_classes,
                  " distinct characters; raise it or leave it out to take it from the data");
  }
  return build_gpt(spec, init, std::move(dropout_gen), device);
}

PrecisionPolicy make_precision_policy(const TrainConfig& config) {
  PrecisionPolicy policy;
  policy.precision = parse_precision(config.precision);
  policy.allow_tf32 = config.tf32;
  return policy;
}

std::unique_ptr<Optimizer> make_optimizer(const TrainConfig& config,
                                          const std::vector<Parameter>& params) {
  const OptimizerConfig& o = config.optimizer;
  if (o.type == "sgd") {
    SgdOptions options;
    options.lr = o.lr;
    options.momentum = o.momentum;
    options.weight_decay = o.weight_decay;
    options.nesterov = o.nesterov;
    return std::make_unique<SGD>(params, options);
  }
  AdamOptions options;
  options.lr = o.lr;
  options.beta1 = o.beta1;
  options.beta2 = o.beta2;
  options.eps = o.eps;
  options.weight_decay = o.weight_decay;
  if (o.type == "adam") return std::make_unique<Adam>(params, options);
  MIXPREC_CHECK(o.type == "adamw", "optimizer.type: expected sgd, adam or adamw, got '", o.type,
                "'");
  return std::make_unique<AdamW>(params, options);
}

std::unique_ptr<LrSchedule> make_schedule(const TrainConfig& config, int64_t total_steps) {
  const ScheduleConfig& s = config.schedule;
  const double lr = config.optimizer.lr;
  if (s.type == "constant") return make_constant_schedule(lr);
  if (s.type == "step") return make_step_schedule(lr, s.step_size, s.gamma);
  MIXPREC_CHECK(s.type == "cosine", "schedule.type: expected constant, step or cosine, got '",
                s.type, "'");
  const int64_t decay = s.decay_steps > 0 ? s.decay_steps : std::max(total_steps, s.warmup_steps);
  return make_warmup_cosine_schedule(lr, s.warmup_steps, decay, s.min_lr);
}

std::unique_ptr<LossScalePolicy> make_loss_scale_policy(const TrainConfig& config) {
  const LossScaleConfig& c = config.loss_scale;
  // auto is built from the config's settings like any other policy, so that a dynamic
  // scale's init_scale or growth_interval given with auto is the one the run uses.
  const std::string policy = effective_loss_scale_policy(c.policy, config.precision);
  if (policy == "none") return std::make_unique<NoLossScale>();
  if (policy == "static") return std::make_unique<StaticLossScale>(c.init_scale);
  MIXPREC_CHECK(policy == "dynamic", "loss_scale.policy: expected auto, dynamic, static or "
                                     "none, got '", c.policy, "'");
  DynamicLossScaleOptions options;
  options.init_scale = c.init_scale;
  options.growth_factor = c.growth_factor;
  options.backoff_factor = c.backoff_factor;
  options.growth_interval = static_cast<int>(c.growth_interval);
  options.hysteresis = static_cast<int>(c.hysteresis);
  options.hysteresis_mode = parse_hysteresis_mode(c.hysteresis_mode);
  options.min_scale = c.min_scale;
  options.max_scale = c.max_scale;
  options.floor_policy = parse_floor_policy(c.floor_policy);
  try {
    validate(options);
  } catch (const Error& e) {
    MIXPREC_FAIL("loss_scale: ", e.what());
  }
  return std::make_unique<DynamicLossScale>(options);
}

int64_t total_optimizer_steps(const TrainConfig& config, const BatchSource& source, int ranks) {
  if (config.train.steps > 0) return config.train.steps;
  const int64_t batches = config.train.epochs * source.batches_per_epoch();
  const int64_t per_step = config.train.accumulation_steps * ranks;
  // One process drops an epoch's last microbatches that do not fill a step; ranks would each
  // drop others, so there the division must be exact for the data seen not to depend on N.
  MIXPREC_CHECK(ranks == 1 || batches % per_step == 0, "train.epochs: ", config.train.epochs,
                " epoch(s) of ", source.batches_per_epoch(), " batches are ", batches,
                " microbatches, which ", ranks, " ranks x accumulation_steps ",
                config.train.accumulation_steps, " do not divide; choose a rank count, "
                "batch_size or accumulation_steps that does, or set train.steps");
  return std::max<int64_t>(1, batches / per_step);
}

TrainConfig as_one_process(const TrainConfig& config, int ranks) {
  TrainConfig one = config;
  one.train.accumulation_steps *= ranks;
  one.distributed = DistributedConfig{};
  return one;
}

}  // namespace mixprec
