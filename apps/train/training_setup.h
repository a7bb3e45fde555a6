// Turns a TrainConfig into the objects a run needs: device, data, model, optimizer, LR
// schedule and loss-scale policy. Each function throws mixprec::Error naming the config key
// when a value cannot be honoured (e.g. `device: cuda` on a machine without a GPU).
#pragma once

#include <memory>

#include "amp/loss_scale.h"
#include "amp/precision.h"
#include "apps/config/train_config.h"
#include "apps/data/batch.h"
#include "core/device.h"
#include "core/generator.h"
#include "layers/module.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"

namespace mixprec {

// cpu; cuda (an error when no CUDA backend is registered); auto = cuda when registered.
Device resolve_device(const std::string& device);

// The data set of `config.data` with the batch size and seed of `config.train` (and, for
// text, the model's block_size).
std::unique_ptr<BatchSource> make_batch_source(const TrainConfig& config);

// The model of `config.model` on `device`, initialised from `init`; for GPT a vocab_size of 0
// is taken from the data (`data_classes`), and a configured vocab_size smaller than the
// data's is an error. Dropout draws from `dropout_gen`.
std::shared_ptr<Module> make_model(const TrainConfig& config, int64_t data_classes, Generator& init,
                                   std::shared_ptr<Generator> dropout_gen, Device device);

PrecisionPolicy make_precision_policy(const TrainConfig& config);
std::unique_ptr<Optimizer> make_optimizer(const TrainConfig& config,
                                          const std::vector<Parameter>& params);
// `total_steps` fills a cosine schedule's decay_steps when the config leaves it 0.
std::unique_ptr<LrSchedule> make_schedule(const TrainConfig& config, int64_t total_steps);
// `policy: auto` gives the precision's default kind (dynamic for fp16, none otherwise), with
// the section's settings as for that policy given by name. Throws mixprec::Error, "loss_scale:
// ...", for dynamic settings DynamicLossScale refuses.
std::unique_ptr<LossScalePolicy> make_loss_scale_policy(const TrainConfig& config);

// Optimizer steps of the run: train.steps, or train.epochs * batches_per_epoch /
// (accumulation_steps * ranks) (at least 1). With more than one rank the division must be
// exact: mixprec::Error otherwise, naming the numbers.
int64_t total_optimizer_steps(const TrainConfig& config, const BatchSource& source,
                              int ranks = 1);

// `config` as one process would run the same steps that `ranks` ranks take: accumulation
// times the ranks, the distributed section at its defaults. Checkpoints record this, so that
// they resume at any rank count.
TrainConfig as_one_process(const TrainConfig& config, int ranks);

}  // namespace mixprec
