// `mixprec inspect`: train a few steps as configured, then gather FP32 gradients on a shadow
// copy of the model and write what FP16 would make of them (apps/inspect/inspect.h).
#include "apps/inspect/inspect.h"

#include <filesystem>
#include <map>
#include <memory>
#include <vector>

#include "amp/grad_scaler.h"
#include "amp/loss_scale.h"
#include "apps/checkpoint/atomic_file.h"
#include "apps/inspect/grad_gatherer.h"
#include "apps/inspect/inspect_report.h"
#include "apps/inspect/tensorboard_histograms.h"
#include "apps/train/optimizer_step.h"
#include "apps/train/run_directory.h"
#include "apps/train/session.h"
#include "apps/train/training_setup.h"
#include "core/error.h"

namespace mixprec {
namespace {

namespace fs = std::filesystem;

const char* const kOutputs[] = {"inspect.json", "summary.txt", "activation_gradients.png",
                                "weight_gradients.png"};

// An existing folder is fine unless an earlier inspect wrote there: its files would be
// replaced one by one, and a failure half-way would leave a mix of two reports.
void require_fresh_inspect_dir(const std::string& dir) {
  std::error_code error;
  MIXPREC_CHECK(!fs::exists(dir, error) || fs::is_directory(dir, error), "--out ", dir,
                ": a file of that name exists");
  for (const char* name : kOutputs)
    MIXPREC_CHECK(!fs::exists(fs::path(dir) / name, error), "--out ", dir,
                  ": it already holds an inspect report (", name, "); choose another folder");
}

struct TrainedSteps {
  int64_t next_batch = 0;  // the first training batch not used
  int64_t skipped = 0;
};

// `steps` optimizer steps of the configured run, as the trainer takes them (take_step, each
// resolved at once), with the LR schedule of the whole configured run.
TrainedSteps train_steps(Session& s, Optimizer& optimizer, GradScaler& scaler, int64_t steps) {
  const TrainConfig& config = s.config;
  const std::unique_ptr<LrSchedule> schedule =
      make_schedule(config, total_optimizer_steps(config, *s.data));
  optimizer.set_lr(schedule->lr_at(optimizer.steps_taken()));
  DeferredSteps deferred(scaler, optimizer);
  TrainedSteps done;
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<Batch> batches;
    for (int64_t micro = 0; micro < config.train.accumulation_steps; ++micro)
      batches.push_back(s.data->train_batch(done.next_batch++));
    take_step(s, optimizer, deferred, *schedule, batches);
    if (deferred.resolve().front().result.stepped()) {
      optimizer.set_lr(schedule->lr_at(optimizer.steps_taken()));
    } else {
      ++done.skipped;
    }
  }
  optimizer.zero_grad();
  return done;
}

// The S of the report and where it comes from.
std::pair<double, std::string> report_scale(const Session& s, const GradScaler& scaler,
                                            int64_t steps) {
  const std::string kind = scaler.policy().kind();
  if (kind != "none") {
    return {scaler.scale_value(), "the " + kind + " loss scale of the config after " +
                                      std::to_string(steps) + " steps."};
  }
  if (s.precision.precision == Precision::FP32) {
    // What switching to fp16 would do: this config's loss_scale section at fp16 (auto is
    // dynamic there, with the section's init_scale).
    TrainConfig as_fp16 = s.config;
    as_fp16.precision = "fp16";
    std::unique_ptr<LossScalePolicy> fp16;
    try {
      fp16 = make_loss_scale_policy(as_fp16);
    } catch (const Error&) {
      // Settings that only fp16 would check (an init_scale outside [min_scale, max_scale]).
      return {1.0, "fp32 trains without loss scaling, and this config's loss_scale settings "
                   "would be refused at fp16, so S = 1."};
    }
    if (!fp16->scales_loss()) {
      return {1.0, "fp32 trains without loss scaling, and this config's loss_scale.policy "
                   "(none) would not scale at fp16 either, so S = 1."};
    }
    return {fp16->scale(), "fp32 trains without loss scaling; this is the scale this config's "
                           "loss_scale section starts with at fp16 (" + fp16->kind() +
                               "), i.e. what switching to fp16 would do."};
  }
  const std::string note = s.config.precision + " trains without loss scaling, so S = 1" +
                           (s.precision.precision == Precision::BF16
                                ? " (BF16 has FP32's exponent range; the FP16 fractions say "
                                  "what FP16 would lose)."
                                : ".");
  return {1.0, note};
}

}  // namespace

nlohmann::json run_inspect(const InspectOptions& options, std::ostream& log) {
  MIXPREC_CHECK(options.steps >= 0, "inspect: --steps must be >= 0, got ", options.steps);
  MIXPREC_CHECK(options.batches >= 1, "inspect: --batches must be >= 1, got ", options.batches);
  Session s = open_session(options.config_path, options.overrides);
  const std::string out_dir =
      options.out_dir.empty() ? default_run_dir(s.config.name + "-inspect") : options.out_dir;
  require_fresh_inspect_dir(out_dir);

  std::unique_ptr<Optimizer> optimizer = make_optimizer(s.config, s.params);
  GradScaler scaler(make_loss_scale_policy(s.config));
  log << "inspect " << s.config.name << ": " << s.data->describe() << "; "
      << s.precision.describe() << "; training " << options.steps << " steps\n";
  const TrainedSteps trained = train_steps(s, *optimizer, scaler, options.steps);
  const auto [scale, scale_note] = report_scale(s, scaler, options.steps);

  // The FP32 shadow: the same architecture built again (its parameters stay F32), given the
  // trained masters and buffers, with its own copy of the dropout stream. Unfused, so that a
  // batchnorm's (or c_fc's) own output gradient is observed rather than that of the relu (or
  // gelu) after it.
  Generator init(s.config.train.seed);
  TrainConfig shadow_config = s.config;
  shadow_config.model.cnn.fuse_batchnorm_relu = false;
  shadow_config.model.gpt.fuse_linear_gelu = false;
  const std::shared_ptr<Module> shadow =
      make_model(shadow_config, s.data->num_classes(), init,
                 std::make_shared<Generator>(*s.dropout_gen), s.device);
  std::map<std::string, Tensor> state;
  for (const auto& [name, value] : s.model->state_dict()) state.emplace(name, value);
  shadow->load_state_dict(state, true);

  inspect::InspectFindings findings;
  {
    inspect::GradGatherer gatherer(*shadow, scale);
    log << "gathering FP32 gradients of " << options.batches << " batch(es) over "
        << gatherer.layer_names().size() << " layers\n";
    for (int64_t b = 0; b < options.batches; ++b)
      gatherer.gather_batch(s.data->train_batch(trained.next_batch + b), s.device);
    findings.gathered = gatherer.result();
  }
  findings.config_path = options.config_path;
  findings.name = s.config.name;
  findings.precision = s.config.precision;
  findings.device = s.device.str();
  findings.steps = options.steps;
  findings.skipped_steps = trained.skipped;
  findings.batches = options.batches;
  findings.scale = scale;
  findings.scale_note = scale_note;
  findings.recommendation = inspect::recommend_scale(findings.gathered.profile);

  // Everything is measured; from here on the folder is written.
  std::error_code fs_error;
  fs::create_directories(out_dir, fs_error);
  MIXPREC_CHECK(!fs_error && fs::is_directory(out_dir, fs_error), "cannot create the folder '",
                out_dir, "': ", fs_error ? fs_error.message() : "a file of that name exists");
  const nlohmann::json report = inspect::inspect_json(findings);
  const std::string json_text = report.dump(2) + "\n";
  write_file_atomic((fs::path(out_dir) / "inspect.json").string(), json_text.data(),
                    json_text.size());
  for (const ChartResult& chart : inspect::write_inspect_charts(out_dir, findings))
    log << chart.message << "\n";
  if (s.config.log.tensorboard) {
    log << "wrote the histograms for TensorBoard to "
        << inspect::write_tensorboard_histograms(out_dir, findings) << "\n";
  }
  const std::string summary = inspect::inspect_summary(findings);
  write_file_atomic((fs::path(out_dir) / "summary.txt").string(), summary.data(), summary.size());
  log << summary << "wrote " << out_dir << "\n";
  return report;
}

}  // namespace mixprec
