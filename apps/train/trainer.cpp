// The training loop of DESIGN.md section 1, driven by a config: data -> model (working dtype)
// -> scaled loss -> backward -> unscale -> clip -> step (or skip) -> update the scale, with
// metrics, evaluation and checkpoints around it.
#include "apps/train/trainer.h"

#include <chrono>
#include <cmath>
#include <optional>
#include <filesystem>
#include <limits>
#include <memory>

#include "amp/deferred_steps.h"
#include "amp/grad_scaler.h"
#include "apps/checkpoint/atomic_file.h"
#include "apps/checkpoint/checkpoint_dir.h"
#include "apps/config/train_config.h"
#include "apps/data/prefetcher.h"
#include "apps/train/batch_loss.h"
#include "apps/train/interrupt.h"
#include "apps/train/nonfinite_guard.h"
#include "apps/train/optimizer_step.h"
#include "apps/train/progress.h"
#include "apps/train/run_directory.h"
#include "apps/train/run_state.h"
#include "apps/train/recorded_step.h"
#include "apps/train/run_stats.h"
#include "apps/train/session.h"
#include "apps/train/training_setup.h"
#include "core/autograd/grad_mode.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/ops/ops.h"

#if MIXPREC_WITH_CUDA
#include "cuda/register.h"
#endif

namespace mixprec {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// How often the host has waited for `device` so far (0 on the CPU, which has nothing to wait
// for).
uint64_t device_host_syncs(Device device) {
#if MIXPREC_WITH_CUDA
  if (device.is_cuda()) return cuda_host_syncs();
#endif
  (void)device;
  return 0;
}

CheckpointData checkpoint_data(const Session& s, RunPosition position, const RunStats& stats,
                               const Optimizer& optimizer, const GradScaler& scaler) {
  CheckpointData data;
  data.model = s.model->state_dict();
  position.recent_losses = stats.recent_losses();
  data.state = make_run_state(s.config, position, optimizer, scaler, *s.dropout_gen);
  return data;
}

// A step as the loop finishes it: its number, wall time, the learning rate after it and the
// data position after it.
struct UnresolvedStep {
  int64_t step = 0;
  double seconds = 0.0;
  double lr_after = 0.0;
  int64_t next_batch = 0;
};

// train.host_reads: "auto" reads at log steps on a GPU, where each read waits for the device.
bool reads_at_log_steps(const TrainConfig& config, Device device) {
  if (config.train.host_reads == "auto") return !device.is_cpu();
  return config.train.host_reads == "at_log";
}

// The values of scalar tensors on one device, in one read.
std::vector<double> read_scalars(const std::vector<Tensor>& scalars) {
  if (scalars.empty()) return {};
  NoGradGuard no_grad;
  std::vector<Tensor> flat;
  for (const Tensor& t : scalars) flat.push_back(ops::reshape(t.to(DType::F32), {1}));
  const std::vector<float> values =
      (flat.size() == 1 ? flat.front() : ops::concat(flat, 0)).to_float_vector();
  return {values.begin(), values.end()};
}

nlohmann::json eval_record(int64_t step, const EvalResult& eval, bool classification) {
  nlohmann::json record{{"event", "eval"}, {"step", step}, {"val_loss", eval.loss}};
  if (classification) record["val_accuracy"] = eval.accuracy;
  return record;
}

// Runs the model once on the first evaluation batch (eval mode, no graph, so nothing moves:
// no batch statistics, no dropout draws) and builds the first training batch: a model that
// does not fit its data, labels beyond the model's outputs or data that cannot be batched
// are reported before the run folder is written.
void probe_model_and_data(Session& s, int64_t first_batch) {
  try {
    NoGradGuard no_grad;
    s.model->eval();
    const Batch batch = s.data->eval_batch(0);
    batch_loss(*s.model, batch, s.device, s.precision.working_dtype());
    s.model->train();
    s.data->train_batch(first_batch);
  } catch (const Error& e) {
    s.model->train();
    MIXPREC_FAIL("the model does not fit the data: ", e.what());
  }
}

// The run folder that `--resume` names: it must be a run folder (config.yaml or
// checkpoints/ directly inside), not one of its checkpoints.
void require_run_folder(const std::string& dir) {
  std::error_code ignored;
  MIXPREC_CHECK(fs::is_directory(dir, ignored), "--resume ", dir, ": no such folder");
  const bool run = fs::exists(fs::path(dir) / "checkpoints", ignored) ||
                   fs::exists(fs::path(dir) / "config.yaml", ignored);
  MIXPREC_CHECK(run, "--resume ", dir, ": not a run folder (it has neither config.yaml nor "
                "checkpoints/); give the folder that `mixprec train --out` wrote");
}

}  // namespace

nlohmann::json run_training(const TrainOptions& options, std::ostream& log) {
  InterruptGuard interrupts;  // SIGINT/SIGTERM: finish the step, save, throw (interrupt.h)
  Session s = open_session(options.config_path, options.overrides);
  const TrainConfig& config = s.config;
  const bool resuming = !options.resume_dir.empty();
  MIXPREC_CHECK(!resuming || options.out_dir.empty() || options.out_dir == options.resume_dir,
                "--resume continues the run in its own folder; drop --out or make it equal");
  const std::string run_dir = resuming ? options.resume_dir
                              : !options.out_dir.empty() ? options.out_dir
                                                         : default_run_dir(config.name);
  const std::string checkpoints_dir = (fs::path(run_dir) / "checkpoints").string();

  std::unique_ptr<Optimizer> optimizer = make_optimizer(config, s.params);
  GradScaler scaler(make_loss_scale_policy(config));
  const int64_t accumulation = config.train.accumulation_steps;
  const int64_t batch_size = config.train.batch_size;
  const bool classification = s.data->is_classification();
  const int64_t tokens_per_sample =
      classification ? 1 : config.model.gpt.block_size;  // throughput unit: samples or tokens

  const int64_t total_steps = total_optimizer_steps(config, *s.data);
  RunPosition position;
  position.schedule_steps = total_steps;
  if (resuming) {
    require_run_folder(run_dir);
    remove_unfinished_saves(checkpoints_dir);  // what a killed save left, before choosing
    const LoadedCheckpoint checkpoint = load_checkpoint(run_dir);
    load_model_weights(s, checkpoint.model, checkpoint.path);
    position = restore_run_state(checkpoint.state, checkpoint.path + "/state.json", config,
                                 *optimizer, scaler, *s.dropout_gen);
    MIXPREC_CHECK(position.step < total_steps, "--resume ", run_dir, ": its newest checkpoint is at step ",
                  position.step, " and this run has ", total_steps,
                  " steps, so there is nothing left to do; raise train.steps to continue it");
  } else {
    require_fresh_run_dir(run_dir);
  }
  RunStats stats;
  stats.restore_recent_losses(position.recent_losses);
  const std::unique_ptr<LrSchedule> schedule = make_schedule(config, position.schedule_steps);
  optimizer->set_lr(schedule->lr_at(optimizer->steps_taken()));
  NonfiniteGuard guard(config, s.params, *s.data, total_steps);
  if (resuming) guard.resume_from(scaler, position.step);
  probe_model_and_data(s, position.next_batch);

  if (interrupt_signal() != 0) {
    throw TrainingInterrupted(interrupt_signal(), position.step, total_steps, run_dir, "");
  }
  // Everything is checked; from here on the run directory is written.
  std::error_code fs_error;
  fs::create_directories(run_dir, fs_error);
  MIXPREC_CHECK(!fs_error && fs::is_directory(run_dir, fs_error), "cannot create the run folder '",
                run_dir, "': ", fs_error ? fs_error.message() : "a file of that name exists");
  const std::string config_text = to_yaml(config);
  write_file_atomic((fs::path(run_dir) / "config.yaml").string(), config_text.data(),
                    config_text.size());
  MetricsLog metrics(run_dir, resuming ? position.step : -1);
  Progress progress(log, options.progress_bar);
  progress.message("run " + run_dir + ": " + s.data->describe() + "; " +
                   std::to_string(s.model->parameter_count()) + " parameters on " +
                   s.device.str() + "; " + s.precision.describe() + "; loss scale " +
                   scaler.policy().kind() + "; " + schedule->describe());
  if (resuming) {
    std::string text = "resumed at step " + std::to_string(position.step) + " of " +
                       std::to_string(total_steps);
    if (position.schedule_steps != total_steps && config.schedule.type == "cosine" &&
        config.schedule.decay_steps == 0) {
      text += "; the cosine schedule keeps the length of the run that started it (" +
              std::to_string(position.schedule_steps) + " steps)";
    }
    progress.message(text);
  }
  if (!resuming && config.checkpoint.save_initial) {
    save_checkpoint(checkpoints_dir, 0, checkpoint_data(s, position, stats, *optimizer, scaler),
                    config.checkpoint.keep);
  }

  AnomalyModeGuard anomaly(config.debug.detect_anomaly);
  // The worker scans each batch's inputs, casts them to the working dtype and uploads them to
  // the device, off this thread.
  Prefetcher batches(*s.data, position.next_batch, s.device, s.precision.working_dtype());
  std::vector<Tensor> pending_losses;  // losses of the steps since they were last read
  double step_loss = std::numeric_limits<double>::quiet_NaN();  // the last loss read
  int64_t loss_step = 0;  // the step it belongs to
  const uint64_t syncs_at_start = device_host_syncs(s.device);
  uint64_t syncs_at_last_log = syncs_at_start;
  int64_t step_at_last_log = position.step;
  const int64_t first_step = position.step;
  int64_t last_saved = resuming ? position.step : -1;
  EvalResult last_eval;
  bool evaluated = false;
  const int64_t samples_per_step = batch_size * accumulation;
  const DType working = s.precision.working_dtype();
  // train.host_reads: with deferred steps the outcome of each step stays on the device
  // until a log, eval or checkpoint step reads all of them at once.
  std::optional<DeferredSteps> deferred;
  if (reads_at_log_steps(config, s.device)) deferred.emplace(scaler, *optimizer);
  // train.cuda_graph: the deferred step recorded once per window and replayed.
  std::optional<RecordedStep> recorded;
  if (config.train.cuda_graph) {
    std::unique_ptr<StepGraphs> graphs;
    if (deferred) graphs = backend_for(s.device).make_step_graphs();
    MIXPREC_CHECK(graphs != nullptr, "train.cuda_graph records the deferred step on a GPU, "
                  "and this run trains on ", s.device, " (device: ", config.device,
                  "); set train.cuda_graph: false or train on a GPU");
    recorded.emplace(s, *optimizer, *deferred, *schedule, std::move(graphs));
  }
  std::vector<UnresolvedStep> unresolved;

  const auto is_log_step = [&](int64_t step) {
    return step % config.train.log_every == 0 || step == total_steps || step == 1;
  };
  // Reads the pending losses in one go (one wait for the device); the caller records them.
  const auto take_pending_losses = [&] {
    const std::vector<double> values = read_scalars(pending_losses);
    pending_losses.clear();
    return values;
  };
  // Everything the loop does with a step whose outcome is known: the skip count, the stop
  // check, the step event, the metrics record and the progress line. `loss_read`: step_loss
  // is this step's loss. Returns true when the run must stop.
  const auto finish_step = [&](const UnresolvedStep& done, StepResult& result,
                               StepTelemetry& telemetry, bool loss_read, bool bad_input) {
    const int64_t step = done.step;
    if (result.skipped()) ++position.skipped_steps;
    const bool log_step = is_log_step(step) || result.skipped();
    // Skipped steps are log steps, so a skipped step's own loss has been read.
    const bool stop_run = guard.finish_step(
        step, result, telemetry,
        loss_read && !bad_input ? std::optional<double>(step_loss) : std::nullopt);
    position.train_seconds += done.seconds;
    stats.record_time(done.seconds);

    if (options.on_step) {
      StepEvent event;
      event.step = step;
      event.seconds = done.seconds;
      event.train_seconds = position.train_seconds;
      event.scale = telemetry.scale;
      event.next_scale = telemetry.next_scale;
      event.skipped = result.skipped();
      if (event.skipped) event.skip_reason = result.reason;
      event.loss = loss_read && !bad_input ? step_loss : std::numeric_limits<double>::quiet_NaN();
      options.on_step(event);
    }

    const double step_time = stats.recent_step_seconds();
    const double throughput =
        step_time > 0 ? static_cast<double>(samples_per_step * tokens_per_sample) / step_time : 0;
    if (log_step) {
      nlohmann::json record = telemetry.to_json();
      record["event"] = "step";
      record["step"] = step;
      record["loss"] = std::isfinite(step_loss) ? nlohmann::json(step_loss)
                                                : nlohmann::json(std::to_string(step_loss));
      const std::optional<double> window_loss = stats.take_window_loss();
      record["train_loss"] = window_loss ? nlohmann::json(*window_loss) : nlohmann::json(nullptr);
      record["lr"] = done.lr_after;
      record["step_ms"] = done.seconds * 1000.0;
      record["elapsed_s"] = position.train_seconds;
      record["epoch"] = (done.next_batch - 1) / s.data->batches_per_epoch();
      record[classification ? "samples_per_s" : "tokens_per_s"] = throughput;
      if (!s.device.is_cpu()) {
        const uint64_t syncs = device_host_syncs(s.device);
        record["host_syncs_per_step"] = static_cast<double>(syncs - syncs_at_last_log) /
                                        static_cast<double>(step - step_at_last_log);
        syncs_at_last_log = syncs;
        step_at_last_log = step;
      }
      guard.annotate(record);
      metrics.write(record);
      if (result.skipped()) progress.message("step " + std::to_string(step) + " skipped: " +
                                             result.reason);
    }
    if (progress.bar() || log_step) {
      ProgressLine line;
      line.step = step;
      line.total = total_steps;
      line.loss = step_loss;
      line.loss_step = loss_step;
      line.scale = telemetry.next_scale;
      line.lr = done.lr_after;
      line.throughput = throughput;
      line.unit = classification ? "samples/s" : "tokens/s";
      line.eta_s = step_time * static_cast<double>(total_steps - step);
      line.skipped = result.skipped();
      progress.step(line);
    }
    return stop_run;
  };
  // Saves the last applied weights (with the data position after the skips) and throws
  // TrainingStopped.
  const auto stop_at = [&](int64_t step) {
    progress.finish();
    const std::string saved = save_checkpoint(
        checkpoints_dir, step, checkpoint_data(s, position, stats, *optimizer, scaler),
        config.checkpoint.keep);
    guard.stop(step, scaler, saved, metrics);  // writes the "stopped" record, throws
  };
  // Reads what the deferred steps did (losses, flags, clip norms: a wait or three for all of
  // them), finishes them in step order and stops the run if the last one ends a run of
  // max_consecutive_skips skips. The host ran ahead of the device, so a step's own wall time
  // says little; each is timed as an equal share of the window from the first one's start to
  // the end of the wait.
  Clock::time_point window_start;
  const auto resolve_deferred = [&] {
    if (unresolved.empty()) return;
    // Recorded one by one below, so that each step's train_loss window holds only the
    // losses up to it.
    const std::vector<double> losses = take_pending_losses();
    std::vector<ResolvedStep> resolved = deferred->resolve();
    // The recording's learning rates and step counts were those of the window just ended.
    if (recorded) recorded->end_window();
    MIXPREC_CHECK(resolved.size() == unresolved.size() && losses.size() == resolved.size(),
                  "internal: ", resolved.size(), " deferred steps resolved for ",
                  unresolved.size(), " taken");
    const double share = seconds_since(window_start) / static_cast<double>(unresolved.size());
    for (UnresolvedStep& step : unresolved) step.seconds = share;
    // The regular loop moves the rate after each taken step: each step's record shows the
    // rate after it, as the schedule gives it for the steps taken by then.
    int64_t taken = 0;
    for (const ResolvedStep& r : resolved) taken += r.result.stepped() ? 1 : 0;
    const int64_t taken_before = optimizer->steps_taken() - taken;
    const double lr_before = optimizer->lr();
    if (taken > 0) optimizer->set_lr(schedule->lr_at(optimizer->steps_taken()));
    bool stop = false;
    int64_t taken_so_far = 0;
    for (size_t i = 0; i < resolved.size(); ++i) {
      taken_so_far += resolved[i].result.stepped() ? 1 : 0;
      unresolved[i].lr_after =
          taken_so_far > 0 ? schedule->lr_at(taken_before + taken_so_far) : lr_before;
      step_loss = losses[i];
      loss_step = unresolved[i].step;
      stats.record_loss(step_loss);
      stop = finish_step(unresolved[i], resolved[i].result, resolved[i].telemetry, true, false) ||
             stop;
    }
    const int64_t last = unresolved.back().step;
    unresolved.clear();
    if (stop) stop_at(last);
  };

  while (position.step < total_steps) {
    const Clock::time_point start = Clock::now();
    const int64_t step = position.step + 1;
    // Every microbatch of the step is checked on the host before any reaches the model, so a
    // bad one skips the step without a forward pass; the data position advances either way.
    std::vector<Batch> step_batches;
    for (int64_t micro = 0; micro < accumulation; ++micro) step_batches.push_back(batches.next());
    // Deferred steps are finished before a step skipped for its input, in step order.
    if (deferred && guard.input_is_bad(step, step_batches)) resolve_deferred();
    position.next_batch += accumulation;
    position.step = step;
    const std::optional<StepResult> bad_input = guard.begin_step(step, step_batches);
    const bool last = step == total_steps;
    const bool eval_step =
        (config.train.eval_every > 0 && step % config.train.eval_every == 0) || last;
    const bool save_step =
        (config.checkpoint.every > 0 && step % config.checkpoint.every == 0) || last;
    UnresolvedStep current{step, 0.0, optimizer->lr(), position.next_batch};
    StepHooks hooks;
    hooks.loss = [&](int64_t micro, const Tensor& loss) { return guard.loss(step, micro, loss); };
    hooks.gradients = [&] { guard.gradients(step); };
    hooks.eager_only = guard.injects_at(step);
    if (deferred && !bad_input) {
      if (unresolved.empty()) window_start = start;
      std::optional<Tensor> loss;
      if (recorded) loss = recorded->take(step, step_batches, hooks);
      pending_losses.push_back(
          loss ? *loss
               : take_deferred_step(s, *optimizer, *deferred, *schedule, step_batches, hooks));
      unresolved.push_back(current);
      // The host reads only where it must: log, eval and checkpoint steps, an interrupt
      // (which saves), a full table of pending steps, and for train.max_consecutive_skips:
      // after every step while steps are being skipped, and at least every that many steps,
      // so that a run of skips starting between reads reaches the limit no later than at
      // the next read, and the run stops at the step per_step stops at.
      const int64_t skip_limit = config.train.max_consecutive_skips;
      if (is_log_step(step) || eval_step || save_step || interrupt_signal() != 0 ||
          deferred->full() || guard.skipped_in_a_row() > 0 ||
          (skip_limit > 0 && static_cast<int64_t>(unresolved.size()) >= skip_limit))
        resolve_deferred();
    } else {
      StepResult result;
      StepTelemetry telemetry;
      if (bad_input) {
        result = *bad_input;
        telemetry = guard.input_skip_telemetry(scaler, result);
      } else {
        StepOutcome outcome =
            take_optimizer_step(s, *optimizer, scaler, *schedule, step_batches, hooks);
        pending_losses.push_back(outcome.loss);
        result = outcome.result;
        telemetry = outcome.telemetry;
      }
      // Inputs that skip the step leave the learning rate where it is, as a skipped step does.
      // Reading a loss waits for the device, so on a GPU the losses are read in one go at log
      // steps; on the CPU reading is free and the bar shows every step's loss. The reads come
      // before the clock stops, so device work still queued is timed in the step that waits
      // for it rather than in none. Checkpoint steps read too: a checkpoint keeps the recent
      // losses (summary.json's train_loss after a resume), as the deferred path's does.
      bool loss_read = false;
      if (is_log_step(step) || save_step || result.skipped() ||
          (progress.bar() && s.device.is_cpu())) {
        loss_read = true;
        const std::vector<double> values = take_pending_losses();
        for (double value : values) stats.record_loss(value);
        if (!values.empty()) step_loss = values.back();
        loss_step = step;
      }
      current.seconds = seconds_since(start);
      current.lr_after = optimizer->lr();
      if (finish_step(current, result, telemetry, loss_read, bad_input.has_value()))
        stop_at(step);
    }

    if (eval_step) {
      last_eval = evaluate(*s.model, *s.data, s.device, working);
      evaluated = true;
      metrics.write(eval_record(step, last_eval, classification));
      char text[128];
      std::snprintf(text, sizeof text, "eval at step %lld: val_loss %.4f%s",
                    static_cast<long long>(step), last_eval.loss,
                    classification
                        ? (", val_accuracy " + std::to_string(last_eval.accuracy)).c_str()
                        : "");
      progress.message(text);
    }
    if (save_step) {
      save_checkpoint(checkpoints_dir, step,
                      checkpoint_data(s, position, stats, *optimizer, scaler),
                      config.checkpoint.keep);
      last_saved = step;
    }
    // An interrupt stops the run here, with this step saved; one during the last step does
    // not, as the run is then complete.
    if (interrupt_signal() != 0 && !last) {
      if (deferred) resolve_deferred();
      for (double value : take_pending_losses()) stats.record_loss(value);  // for the save
      progress.finish();
      if (last_saved != step) {
        save_checkpoint(checkpoints_dir, step,
                        checkpoint_data(s, position, stats, *optimizer, scaler),
                        config.checkpoint.keep);
      }
      throw TrainingInterrupted(interrupt_signal(), step, total_steps, run_dir,
                                checkpoint_folder(checkpoints_dir, step));
    }
  }
  progress.finish();
  if (!evaluated) last_eval = evaluate(*s.model, *s.data, s.device, working);
  if (last_saved != position.step) {
    save_checkpoint(checkpoints_dir, position.step,
                    checkpoint_data(s, position, stats, *optimizer, scaler),
                    config.checkpoint.keep);
  }

  const double median_s = stats.median_step_seconds();
  const std::optional<double> train_loss = stats.recent_loss();
  nlohmann::json summary{
      {"name", config.name},
      {"run_dir", run_dir},
      {"steps", position.step},
      {"skipped_steps", position.skipped_steps},
      {"final_scale", scaler.scale_value()},
      {"train_loss", train_loss ? nlohmann::json(*train_loss) : nlohmann::json(nullptr)},
      {"val_loss", last_eval.loss},
      {"median_step_ms", median_s * 1000.0},
      {"train_seconds", position.train_seconds},
      {"precision", config.precision},
      {"tf32", config.tf32},
      {"device", s.device.str()},
      {"parameters", s.model->parameter_count()},
      {"batch_size", batch_size},
      {"accumulation_steps", accumulation},
  };
  if (!s.device.is_cpu() && position.step > first_step) {
    // Evaluations and checkpoints wait for the device too; they are counted in.
    summary["host_syncs_per_step"] =
        static_cast<double>(device_host_syncs(s.device) - syncs_at_start) /
        static_cast<double>(position.step - first_step);
  }
  if (recorded) {
    // Steps taken by a replay; a recording is made once per window (and its step replayed).
    summary["cuda_graph"] = {{"recordings", recorded->recordings()},
                             {"replays", recorded->replays()}};
  }
  const double per_s = median_s > 0 ? static_cast<double>(samples_per_step) / median_s : 0.0;
  if (classification) {
    summary["val_accuracy"] = last_eval.accuracy;
    summary["samples_per_s"] = per_s;
  } else {
    summary["tokens_per_s"] = per_s * static_cast<double>(tokens_per_sample);
  }
  const std::string summary_text = summary.dump(2) + "\n";
  write_file_atomic((fs::path(run_dir) / "summary.json").string(), summary_text.data(),
                    summary_text.size());
  return summary;
}

}  // namespace mixprec
