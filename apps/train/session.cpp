#include "apps/train/session.h"

#include "apps/train/training_setup.h"
#include "core/error.h"

namespace mixprec {

Session open_session(const std::string& config_path, const std::vector<std::string>& overrides) {
  Session s;
  s.config = load_train_config(config_path, overrides);
  s.device = resolve_device(s.config.device);
  s.precision = make_precision_policy(s.config);
  s.data = make_batch_source(s.config);
  Generator init(s.config.train.seed);
  // A different seed for the dropout stream, so that its masks are not the initial weights'
  // random numbers over again.
  s.dropout_gen = std::make_shared<Generator>(s.config.train.seed ^ 0x9e3779b97f4a7c15ULL);
  s.model = make_model(s.config, s.data->num_classes(), init, s.dropout_gen, s.device);
  s.params = s.model->parameters();
  s.precision.apply(s.params);
  return s;
}

void load_model_weights(Session& session, const std::map<std::string, Tensor>& model_state,
                        const std::string& checkpoint_path) {
  try {
    session.model->load_state_dict(model_state, true);
  } catch (const Error& e) {
    MIXPREC_FAIL(checkpoint_path, "/model.safetensors does not fit this model: ", e.what());
  }
}

}  // namespace mixprec
