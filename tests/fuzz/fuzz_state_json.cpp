// Fuzzes the resume path of a checkpoint's state.json: nlohmann::json::parse, then
// restore_run_state (apps/train/run_state.h) into three fixed setups over one small CNN (the
// model of the seeds' runs: conv 2x3x3, relu, flatten, linear 3 on 1x6x6 images): Adam with a
// dynamic loss scale, SGD with momentum and a static one, AdamW without scaling. An input
// restores into at most one of them; the others reject its optimizer type or scaler kind.
//
// The config fingerprint is a checksum of the whole config, which mutations would almost never
// keep, so a string "fingerprint" is replaced by the one of the fixed config before restoring;
// other values of it stay, so that its type check is still fuzzed.
//
// Expected: an error of nlohmann::json::parse or a mixprec::Error. A bug: a crash, a sanitizer report,
// another exception, or a restored state that does not survive make_run_state and a second
// restore unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "amp/dynamic_loss_scale.h"
#include "amp/grad_scaler.h"
#include "amp/no_loss_scale.h"
#include "amp/static_loss_scale.h"
#include "apps/train/run_state.h"
#include "core/error.h"
#include "core/generator.h"
#include "layers/model_builder.h"
#include "optim/adam.h"
#include "optim/sgd.h"

namespace {

using namespace mixprec;

struct Fixture {
  TrainConfig config;
  std::vector<Parameter> params;
  std::string fingerprint;
};

const Fixture& fixture() {
  static const Fixture f = [] {
    Fixture out;
    CnnSpec& cnn = out.config.model.cnn;
    cnn.in_channels = 1;
    cnn.input_size = 6;
    CnnLayerSpec conv;
    conv.kind = CnnLayerSpec::Kind::Conv;
    conv.out = 2;
    conv.kernel = 3;
    CnnLayerSpec relu;
    relu.kind = CnnLayerSpec::Kind::ReLU;
    CnnLayerSpec flatten;
    flatten.kind = CnnLayerSpec::Kind::Flatten;
    CnnLayerSpec linear;
    linear.kind = CnnLayerSpec::Kind::Linear;
    linear.out = 3;
    cnn.layers = {conv, relu, flatten, linear};
    out.config.data.num_classes = 3;
    Generator init(0);
    // The model object is kept alive by its parameters, which share its tensors.
    const std::shared_ptr<Module> model = build_cnn(cnn, init, std::make_shared<Generator>(1));
    out.params = model->parameters();
    out.fingerprint = resume_fingerprint(out.config);
    return out;
  }();
  return f;
}

struct Setup {
  const char* name;
  std::function<std::unique_ptr<Optimizer>(const std::vector<Parameter>&)> optimizer;
  std::function<std::unique_ptr<LossScalePolicy>()> policy;
};

const std::vector<Setup>& setups() {
  static const std::vector<Setup> all = {
      {"adam + dynamic",
       [](const std::vector<Parameter>& p) { return std::make_unique<Adam>(p, AdamOptions{}); },
       [] { return std::make_unique<DynamicLossScale>(); }},
      {"sgd + static",
       [](const std::vector<Parameter>& p) {
         SgdOptions options;
         options.momentum = 0.9;
         return std::make_unique<SGD>(p, options);
       },
       [] { return std::make_unique<StaticLossScale>(1024.0); }},
      {"adamw + none",
       [](const std::vector<Parameter>& p) { return std::make_unique<AdamW>(p, AdamOptions{}); },
       [] { return std::make_unique<NoLossScale>(); }},
  };
  return all;
}

[[noreturn]] void fail(const Setup& setup, const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_state_json (%s): %s\n%s\n", setup.name, what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fixture();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(data, data + size);
  } catch (const nlohmann::json::exception&) {
    // parse_error, and out_of_range for a number beyond double's range (1e400).
    return 0;
  }
  const Fixture& f = fixture();
  if (state.is_object() && state.contains("fingerprint") && state["fingerprint"].is_string()) {
    state["fingerprint"] = f.fingerprint;
  }
  for (const Setup& setup : setups()) {
    std::unique_ptr<Optimizer> optimizer = setup.optimizer(f.params);
    GradScaler scaler(setup.policy());
    Generator dropout_gen(7);
    RunPosition position;
    try {
      position = restore_run_state(state, "state.json", f.config, *optimizer, scaler, dropout_gen);
    } catch (const Error&) {
      continue;
    }
    // What was restored is written and restored again, and must come back the same.
    const nlohmann::json saved =
        make_run_state(f.config, position, *optimizer, scaler, dropout_gen);
    std::unique_ptr<Optimizer> optimizer2 = setup.optimizer(f.params);
    GradScaler scaler2(setup.policy());
    Generator dropout_gen2(7);
    RunPosition position2;
    try {
      position2 =
          restore_run_state(saved, "saved.json", f.config, *optimizer2, scaler2, dropout_gen2);
    } catch (const Error& e) {
      fail(setup, "a restored state, saved again, does not restore", e.what());
    }
    const nlohmann::json again =
        make_run_state(f.config, position2, *optimizer2, scaler2, dropout_gen2);
    if (again != saved) {
      fail(setup, "a restored state does not survive save and restore",
           saved.dump(1) + "\n---\n" + again.dump(1));
    }
  }
  return 0;
}
