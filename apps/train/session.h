// A Session: what `train` and `eval` both build from a config before they differ — the
// resolved device, the precision policy, the data, the model (with its working copies in the
// working dtype) and the dropout generator that checkpoints save.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "amp/precision.h"
#include "apps/config/train_config.h"
#include "apps/data/batch.h"
#include "core/device.h"
#include "core/generator.h"
#include "layers/module.h"

namespace mixprec {

struct Session {
  TrainConfig config;
  Device device;
  PrecisionPolicy precision;
  std::unique_ptr<BatchSource> data;
  std::shared_ptr<Generator> dropout_gen;
  std::shared_ptr<Module> model;
  std::vector<Parameter> params;
};

// Loads the config (with --set overrides) and builds everything above. Two random streams
// come from train.seed: one initialises the weights, the other draws dropout masks. Throws
// mixprec::Error for bad input; writes nothing.
Session open_session(const std::string& config_path, const std::vector<std::string>& overrides);

// Replaces the model's weights and buffers by those of `model_state` (strict), saying which
// checkpoint did not fit when it does not.
void load_model_weights(Session& session, const std::map<std::string, Tensor>& model_state,
                        const std::string& checkpoint_path);

}  // namespace mixprec
