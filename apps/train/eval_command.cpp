// `mixprec eval`: a checkpoint's loss and accuracy on the validation/test split.
#include "apps/checkpoint/checkpoint_dir.h"
#include "apps/train/batch_loss.h"
#include "apps/train/session.h"
#include "apps/train/trainer.h"

namespace mixprec {

nlohmann::json run_evaluation(const EvalOptions& options) {
  Session s = open_session(options.config_path, options.overrides);
  const LoadedCheckpoint checkpoint = load_checkpoint(options.checkpoint);
  load_model_weights(s, checkpoint.model, checkpoint.path);
  const EvalResult eval = evaluate(*s.model, *s.data, s.device, s.precision.working_dtype());
  const nlohmann::json& state = checkpoint.state;
  const bool has_step = state.is_object() && state.contains("step") &&
                        state["step"].is_number_integer();
  nlohmann::json result{
      {"checkpoint", checkpoint.path},
      {"step", has_step ? state["step"].get<int64_t>() : int64_t{-1}},
      {"split", s.data->is_classification() ? "test" : "validation"},
      {"loss", eval.loss},
      {"targets", eval.targets},
      {"precision", s.config.precision},
      {"device", s.device.str()},
  };
  if (s.data->is_classification()) result["accuracy"] = eval.accuracy;
  return result;
}

}  // namespace mixprec
