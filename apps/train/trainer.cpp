// The training loop of DESIGN.md section 1, driven by a config: data -> model (working dtype)
// -> scaled loss -> backward -> unscale -> clip -> step (or skip) -> update the scale, with
// metrics, evaluation and checkpoints around it.
#include "apps/train/trainer.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
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
#include "apps/tensorboard/metrics_events.h"
#include "apps/train/batch_loss.h"
#include "apps/train/gradient_sync.h"
#include "apps/train/interrupt.h"
#include "apps/train/nonfinite_guard.h"
#include "apps/train/optimizer_step.h"
#include "apps/train/progress.h"
#include "apps/train/rank_output.h"
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
#include "dist/communicator.h"

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

// `ranks`: the run's rank count; the state records the run as one process would run it
// (as_one_process), so that it resumes at any rank count. `optimizer`: the optimizer's whole
// state (a sharded optimizer's gathered from its ranks).
CheckpointData checkpoint_data(const Session& s, RunPosition position, const RunStats& stats,
                               const OptimizerState& optimizer, const GradScaler& scaler,
                               int ranks) {
  CheckpointData data;
  data.model = s.model->state_dict();
  position.recent_losses = stats.recent_losses();
  data.state = make_run_state(as_one_process(s.config, ranks), position, optimizer, scaler,
                              *s.dropout_gen);
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

// train.host_reads: "auto" reads at log steps on a GPU, where each read waits for the device;
// otherwise (per_step) every step is resolved as soon as it is taken.
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


// One run of `mixprec train`, its phases as methods: the constructor prepares (checks
// everything, restores a checkpoint, writes the run folder's config.yaml and the header),
// step() takes one optimizer step with its log records, evaluation and checkpoint, finish()
// evaluates, saves and writes summary.json.
//
// Every step takes one path: its outcome (skipped or not, the scale, the clip norm) is
// decided on the device (amp/deferred_steps.h), and the host reads what happened at the
// next resolve. With train.host_reads per_step (auto on the CPU) each step is resolved at
// once, a window of one; at_log leaves them on the device until a log, eval or checkpoint
// step. train.cuda_graph records the same step and replays it (apps/train/recorded_step.h).
// Only a step skipped for its input (NonfiniteGuard) never reaches the device.
class TrainingRun {
 public:
  TrainingRun(const TrainOptions& options, std::ostream& log);
  bool done() const { return position_.step >= total_steps_; }
  void step();
  nlohmann::json finish();

 private:
  void restore_or_check_fresh();
  void write_run_folder();
  void start_step_path();
  // The phases of step(): take the step on the device or skip it for its input, then finish
  // what is known of it.
  void take(int64_t step, const std::vector<Batch>& batches, const UnresolvedStep& current,
            const Clock::time_point& start, bool resolve_now);
  void skip_for_input(StepResult result, UnresolvedStep current,
                      const Clock::time_point& start);
  void resolve();
  // Everything the loop does with a step whose outcome is known: the skip count, the stop
  // check, the step event, the metrics record and the progress line. Returns true when the
  // run must stop.
  bool finish_step(const UnresolvedStep& done, StepResult& result, StepTelemetry& telemetry,
                   bool loss_read, bool bad_input);
  void notify(const UnresolvedStep& done, const StepResult& result,
              const StepTelemetry& telemetry, bool loss_known);
  void log_step(const UnresolvedStep& done, const StepResult& result,
                const StepTelemetry& telemetry, double throughput);
  void show_progress(const UnresolvedStep& done, const StepResult& result,
                     const StepTelemetry& telemetry, double throughput);
  void evaluate(int64_t step);
  // Writes `record` to metrics.jsonl and, with log.tensorboard, to the event file.
  void write_record(const nlohmann::json& record);
  void checkpoint(int64_t step);
  // Saves the last applied weights (with the data position after the skips) and throws
  // TrainingStopped.
  [[noreturn]] void stop_at(int64_t step);
  // An interrupt stops the run after `step`, with it saved; one during the last step does
  // not, as the run is then complete.
  void stop_if_interrupted(int64_t step, bool last);
  bool is_log_step(int64_t step) const {
    return step % config_.train.log_every == 0 || step == total_steps_ || step == 1;
  }
  // A collective with a sharded optimizer (its state is gathered from every rank).
  CheckpointData checkpoint_state() const {
    return checkpoint_data(s_, position_, stats_,
                           shards_ ? shards_->gather_state() : optimizer_->state_dict(), scaler_,
                           ranks_->size());
  }
  // Rank 0 writes the run folder; the other ranks of a data-parallel run write nothing.
  bool writes() const { return ranks_->rank() == 0; }
  // Saves on rank 0 and returns the checkpoint folder (on every rank).
  std::string save(int64_t step);
  // Stops the run when the ranks' weights or scaler state differ (they never should).
  void check_ranks_agree(int64_t step);

  const TrainOptions& options_;
  InterruptGuard interrupts_;  // SIGINT/SIGTERM: finish the step, save, throw (interrupt.h)
  Session s_;
  const TrainConfig& config_;
  const bool resuming_;
  std::unique_ptr<dist::Communicator> ranks_;
  std::string run_dir_;
  std::string checkpoints_dir_;
  std::unique_ptr<Optimizer> optimizer_;
  GradScaler scaler_;
  const bool classification_;
  const int64_t tokens_per_sample_;  // throughput unit: samples or tokens
  const int64_t samples_per_step_;
  int64_t total_steps_ = 0;
  RunPosition position_;
  RunStats stats_;
  std::unique_ptr<LrSchedule> schedule_;
  std::optional<NonfiniteGuard> guard_;
  std::optional<MetricsLog> metrics_;
  std::optional<tensorboard::MetricsEventLog> tensorboard_;
  Progress progress_;
  std::optional<AnomalyModeGuard> anomaly_;
  // The worker scans each batch's inputs, casts them to the working dtype and uploads them
  // to the device, off this thread.
  std::optional<Prefetcher> batches_;
  std::optional<DeferredSteps> deferred_;
  std::optional<RecordedStep> recorded_;
  std::optional<GradientSync> sync_;  // more than one rank
  std::optional<OptimizerShards> shards_;  // distributed.shard_optimizer
  bool window_of_one_ = true;  // train.host_reads: resolve every step
  std::vector<UnresolvedStep> unresolved_;
  std::vector<Tensor> pending_losses_;  // losses of the steps since they were last read
  Clock::time_point window_start_;
  double step_loss_ = std::numeric_limits<double>::quiet_NaN();  // the last loss read
  int64_t loss_step_ = 0;  // the step it belongs to
  uint64_t syncs_at_start_ = 0;
  uint64_t syncs_at_last_log_ = 0;
  int64_t step_at_last_log_ = 0;
  int64_t first_step_ = 0;
  int64_t last_saved_ = -1;
  EvalResult last_eval_;
  bool evaluated_ = false;
};

TrainingRun::TrainingRun(const TrainOptions& options, std::ostream& log)
    : options_(options),
      s_(open_session(options.config_path, options.overrides)),
      config_(s_.config),
      resuming_(!options.resume_dir.empty()),
      ranks_(dist::make_communicator(config_.distributed.backend, config_.distributed.timeout_s,
                                     s_.device)),
      optimizer_(make_optimizer(config_, s_.params)),
      scaler_(make_loss_scale_policy(config_)),
      classification_(s_.data->is_classification()),
      tokens_per_sample_(classification_ ? 1 : config_.model.gpt.block_size),
      samples_per_step_(config_.train.batch_size * config_.train.accumulation_steps *
                        ranks_->size()),
      progress_(log, options.progress_bar) {
  MIXPREC_CHECK(!resuming_ || options.out_dir.empty() || options.out_dir == options.resume_dir,
                "--resume continues the run in its own folder; drop --out or make it equal");
  run_dir_ = resuming_ ? options.resume_dir
             : !options.out_dir.empty() ? options.out_dir
                                        : default_run_dir(config_.name);
  if (ranks_->size() > 1) {
    // The default folder's name has the time in it, which ranks may read a second apart.
    const std::vector<uint8_t> name =
        ranks_->broadcast_bytes(std::vector<uint8_t>(run_dir_.begin(), run_dir_.end()), 0);
    run_dir_.assign(name.begin(), name.end());
    MIXPREC_CHECK(!config_.train.cuda_graph, "train.cuda_graph records one process's step; "
                  "set it to false for a run of ", ranks_->size(), " ranks");
  }
  checkpoints_dir_ = (fs::path(run_dir_) / "checkpoints").string();
  total_steps_ = total_optimizer_steps(config_, *s_.data, ranks_->size());
  position_.schedule_steps = total_steps_;
  restore_or_check_fresh();
  stats_.restore_recent_losses(position_.recent_losses);
  schedule_ = make_schedule(config_, position_.schedule_steps);
  optimizer_->set_lr(schedule_->lr_at(optimizer_->steps_taken()));
  guard_.emplace(config_, s_.params, *s_.data, total_steps_, ranks_.get());
  if (resuming_) guard_->resume_from(scaler_, position_.step);
  probe_model_and_data(s_, position_.next_batch);
  if (interrupt_signal() != 0) {
    throw TrainingInterrupted(interrupt_signal(), position_.step, total_steps_, run_dir_, "");
  }
  // Everything is checked; from here on the run directory is written.
  write_run_folder();
  anomaly_.emplace(config_.debug.detect_anomaly);
  // Rank r of N takes the step's microbatches r, r + N, ...: those one process would take
  // as its (r+1)-th, (r+N+1)-th, ... microbatch.
  batches_.emplace(*s_.data, position_.next_batch + ranks_->rank(), s_.device,
                   s_.precision.working_dtype(), ranks_->size());
  if (ranks_->size() > 1) {
    sync_.emplace(*ranks_, s_.params, *s_.model);
    if (config_.distributed.shard_optimizer) {
      shards_.emplace(*ranks_, s_.params, *optimizer_);
      sync_->shard(&*shards_);
    }
  }
  start_step_path();
  syncs_at_start_ = device_host_syncs(s_.device);
  syncs_at_last_log_ = syncs_at_start_;
  step_at_last_log_ = position_.step;
  first_step_ = position_.step;
  last_saved_ = resuming_ ? position_.step : -1;
}

void TrainingRun::restore_or_check_fresh() {
  if (!resuming_) {
    if (writes()) require_fresh_run_dir(run_dir_);
    return;
  }
  require_run_folder(run_dir_);
  // What a killed save left, before choosing; by rank 0 alone, while the others wait.
  if (writes()) remove_unfinished_saves(checkpoints_dir_);
  ranks_->barrier();
  const LoadedCheckpoint checkpoint = load_checkpoint(run_dir_);
  load_model_weights(s_, checkpoint.model, checkpoint.path);
  position_ = restore_run_state(checkpoint.state, checkpoint.path + "/state.json",
                                as_one_process(config_, ranks_->size()), *optimizer_, scaler_,
                                *s_.dropout_gen);
  MIXPREC_CHECK(position_.step < total_steps_, "--resume ", run_dir_,
                ": its newest checkpoint is at step ", position_.step, " and this run has ",
                total_steps_,
                " steps, so there is nothing left to do; raise train.steps to continue it");
}

void TrainingRun::write_run_folder() {
  if (!writes()) {
    metrics_.emplace();
    return;
  }
  std::error_code fs_error;
  fs::create_directories(run_dir_, fs_error);
  MIXPREC_CHECK(!fs_error && fs::is_directory(run_dir_, fs_error),
                "cannot create the run folder '", run_dir_,
                "': ", fs_error ? fs_error.message() : "a file of that name exists");
  const std::string config_text = to_yaml(config_);
  write_file_atomic((fs::path(run_dir_) / "config.yaml").string(), config_text.data(),
                    config_text.size());
  metrics_.emplace(run_dir_, resuming_ ? position_.step : -1);
  // A resumed run adds a file that TensorBoard reads after the earlier ones, which drops
  // their points after the checkpoint as metrics.jsonl dropped its lines.
  if (config_.log.tensorboard && resuming_) {
    tensorboard_.emplace(run_dir_, position_.step + 1, metrics_->kept_records());
  } else if (config_.log.tensorboard) {
    tensorboard_.emplace(run_dir_);
  }
  std::string where = s_.device.str();
  if (ranks_->size() > 1) {
    where += " x " + std::to_string(ranks_->size()) + " ranks (" + ranks_->backend() +
             "), a step of batch_size " + std::to_string(config_.train.batch_size) + " x " +
             std::to_string(config_.train.accumulation_steps) + " accumulation x " +
             std::to_string(ranks_->size()) + " ranks = " + std::to_string(samples_per_step_) +
             " examples";
  }
  progress_.message("run " + run_dir_ + ": " + s_.data->describe() + "; " +
                    std::to_string(s_.model->parameter_count()) + " parameters on " + where +
                    "; " + s_.precision.describe() + "; loss scale " +
                    scaler_.policy().kind() + "; " + schedule_->describe());
  if (resuming_) {
    std::string text = "resumed at step " + std::to_string(position_.step) + " of " +
                       std::to_string(total_steps_);
    if (position_.schedule_steps != total_steps_ && config_.schedule.type == "cosine" &&
        config_.schedule.decay_steps == 0) {
      text += "; the cosine schedule keeps the length of the run that started it (" +
              std::to_string(position_.schedule_steps) + " steps)";
    }
    progress_.message(text);
  }
  if (!resuming_ && config_.checkpoint.save_initial) save(0);
}

void TrainingRun::start_step_path() {
  window_of_one_ = !reads_at_log_steps(config_, s_.device);
  deferred_.emplace(scaler_, *optimizer_);
  if (!config_.train.cuda_graph) return;
  // A recording pays off over a window of steps; with a window of one it would be made anew
  // at every step.
  std::unique_ptr<StepGraphs> graphs;
  if (!window_of_one_) graphs = backend_for(s_.device).make_step_graphs();
  MIXPREC_CHECK(graphs != nullptr, "train.cuda_graph records the deferred step on a GPU, "
                "and this run trains on ", s_.device, " (device: ", config_.device,
                "); set train.cuda_graph: false or train on a GPU");
  recorded_.emplace(s_, *optimizer_, *deferred_, *schedule_, std::move(graphs));
}

// Test hook: MIXPREC_TEST_STALL_RANK="R:S" makes rank R stop answering at step S (it sleeps
// for ten minutes), so that the tests can watch the other ranks' watchdog end the job.
void stall_if_asked(int rank, int64_t step) {
  const char* spec = std::getenv("MIXPREC_TEST_STALL_RANK");
  long long at_rank = -1, at_step = -1;
  if (spec == nullptr || std::sscanf(spec, "%lld:%lld", &at_rank, &at_step) != 2) return;
  if (at_rank == rank && at_step == step) std::this_thread::sleep_for(std::chrono::minutes(10));
}

void TrainingRun::step() {
  const Clock::time_point start = Clock::now();
  const int64_t step = position_.step + 1;
  ranks_->set_step(step);
  stall_if_asked(ranks_->rank(), step);
  // Every microbatch of the step is checked on the host before any reaches the model, so a
  // bad one skips the step without a forward pass; the data position advances either way.
  std::vector<Batch> step_batches;
  for (int64_t micro = 0; micro < config_.train.accumulation_steps; ++micro)
    step_batches.push_back(batches_->next());
  // Steps still on the device are finished before a step skipped for its input, in order.
  if (guard_->input_is_bad(step, step_batches)) resolve();
  const int64_t first_batch = position_.next_batch;
  position_.next_batch += config_.train.accumulation_steps * ranks_->size();
  position_.step = step;
  const std::optional<StepResult> bad_input = guard_->begin_step(step, step_batches);
  const bool last = step == total_steps_;
  const bool eval_step =
      (config_.train.eval_every > 0 && step % config_.train.eval_every == 0) || last;
  const bool save_step =
      (config_.checkpoint.every > 0 && step % config_.checkpoint.every == 0) || last;
  const UnresolvedStep current{step, 0.0, optimizer_->lr(), position_.next_batch};
  if (bad_input) {
    skip_for_input(*bad_input, current, start);
  } else {
    // A recorded step replays its dropout masks from the step's first stream on
    // (optimizer_step.h's dropout_stream).
    if (s_.dropout_gen) s_.dropout_gen->set_state(s_.dropout_gen->seed(), dropout_stream(first_batch));
    take(step, step_batches, current, start, eval_step || save_step);
  }
  // The Generator as the next step starts, whichever rank took the last microbatch: a
  // checkpoint then records the same state at any rank count.
  if (s_.dropout_gen)
    s_.dropout_gen->set_state(s_.dropout_gen->seed(), dropout_stream(position_.next_batch));
  if (eval_step) evaluate(step);
  if (save_step) checkpoint(step);
  stop_if_interrupted(step, last);
}

void TrainingRun::take(int64_t step, const std::vector<Batch>& batches,
                       const UnresolvedStep& current, const Clock::time_point& start,
                       bool resolve_now) {
  StepHooks hooks;
  hooks.loss = [this, step](int64_t micro, const Tensor& loss) {
    return guard_->loss(step, micro, loss);
  };
  hooks.gradients = [this, step] { guard_->gradients(step); };
  hooks.eager_only = guard_->injects_at(step);
  if (unresolved_.empty()) window_start_ = start;
  std::optional<Tensor> loss;
  if (recorded_) loss = recorded_->take(step, batches, hooks);
  pending_losses_.push_back(loss ? *loss
                                 : take_step(s_, *optimizer_, *deferred_, *schedule_, batches,
                                             hooks, sync_ ? &*sync_ : nullptr));
  unresolved_.push_back(current);
  // The host reads only where it must: every step with a window of one; otherwise log, eval
  // and checkpoint steps, an interrupt (which saves), a full table of pending steps, and for
  // train.max_consecutive_skips: after every step while steps are being skipped, and at
  // least every that many steps, so that a run of skips starting between reads reaches the
  // limit no later than at the next read, and the run stops at the step a window of one
  // stops at.
  const int64_t skip_limit = config_.train.max_consecutive_skips;
  if (window_of_one_ || resolve_now || is_log_step(step) || interrupt_signal() != 0 ||
      deferred_->full() || guard_->skipped_in_a_row() > 0 ||
      (skip_limit > 0 && static_cast<int64_t>(unresolved_.size()) >= skip_limit))
    resolve();
}

void TrainingRun::skip_for_input(StepResult result, UnresolvedStep current,
                                 const Clock::time_point& start) {
  // Inputs that skip the step leave the learning rate where it is, as a skipped step does.
  // The steps before it were resolved (step()), so there is no loss left to read.
  StepTelemetry telemetry = guard_->input_skip_telemetry(scaler_, result);
  loss_step_ = current.step;
  current.seconds = seconds_since(start);
  current.lr_after = optimizer_->lr();
  if (finish_step(current, result, telemetry, true, true)) stop_at(current.step);
}

// Reads what the pending steps did (losses, flags, clip norms: a wait or three for all of
// them), finishes them in step order and stops the run if the last one ends a run of
// max_consecutive_skips skips. The host ran ahead of the device, so a step's own wall time
// says little; each is timed as an equal share of the window from the first one's start to
// the end of the wait.
void TrainingRun::resolve() {
  if (unresolved_.empty()) return;
  // Recorded one by one below, so that each step's train_loss window holds only the losses
  // up to it.
  const std::vector<double> losses = read_scalars(pending_losses_);
  pending_losses_.clear();
  std::vector<ResolvedStep> resolved = deferred_->resolve();
  // The recording's learning rates and step counts were those of the window just ended.
  if (recorded_) recorded_->end_window();
  MIXPREC_CHECK(resolved.size() == unresolved_.size() && losses.size() == resolved.size(),
                "internal: ", resolved.size(), " deferred steps resolved for ",
                unresolved_.size(), " taken");
  const double share = seconds_since(window_start_) / static_cast<double>(unresolved_.size());
  // Each step's record shows the rate after it, as the schedule gives it for the steps
  // taken by then.
  int64_t taken = 0;
  for (const ResolvedStep& r : resolved) taken += r.result.stepped() ? 1 : 0;
  const int64_t taken_before = optimizer_->steps_taken() - taken;
  const double lr_before = optimizer_->lr();
  if (taken > 0) optimizer_->set_lr(schedule_->lr_at(optimizer_->steps_taken()));
  bool stop = false;
  int64_t taken_so_far = 0;
  for (size_t i = 0; i < resolved.size(); ++i) {
    UnresolvedStep& done = unresolved_[i];
    done.seconds = share;
    taken_so_far += resolved[i].result.stepped() ? 1 : 0;
    done.lr_after = taken_so_far > 0 ? schedule_->lr_at(taken_before + taken_so_far) : lr_before;
    step_loss_ = losses[i];
    loss_step_ = done.step;
    stats_.record_loss(step_loss_);
    stop = finish_step(done, resolved[i].result, resolved[i].telemetry, true, false) || stop;
  }
  const int64_t last = unresolved_.back().step;
  unresolved_.clear();
  if (stop) stop_at(last);
}

bool TrainingRun::finish_step(const UnresolvedStep& done, StepResult& result,
                              StepTelemetry& telemetry, bool loss_read, bool bad_input) {
  if (result.skipped()) ++position_.skipped_steps;
  const bool loss_known = loss_read && !bad_input;
  const bool stop_run = guard_->finish_step(
      done.step, result, telemetry, loss_known ? std::optional<double>(step_loss_) : std::nullopt);
  position_.train_seconds += done.seconds;
  stats_.record_time(done.seconds);
  notify(done, result, telemetry, loss_known);
  const double step_time = stats_.recent_step_seconds();
  const double throughput =
      step_time > 0 ? static_cast<double>(samples_per_step_ * tokens_per_sample_) / step_time
                    : 0;
  // Skipped steps are log steps, so a skipped step's own loss has been read.
  const bool log = is_log_step(done.step) || result.skipped();
  if (log) check_ranks_agree(done.step);
  if (log) log_step(done, result, telemetry, throughput);
  if (progress_.bar() || log) show_progress(done, result, telemetry, throughput);
  return stop_run;
}

void TrainingRun::notify(const UnresolvedStep& done, const StepResult& result,
                         const StepTelemetry& telemetry, bool loss_known) {
  if (!options_.on_step) return;
  StepEvent event;
  event.step = done.step;
  event.seconds = done.seconds;
  event.train_seconds = position_.train_seconds;
  event.scale = telemetry.scale;
  event.next_scale = telemetry.next_scale;
  event.skipped = result.skipped();
  if (event.skipped) event.skip_reason = result.reason;
  event.loss = loss_known ? step_loss_ : std::numeric_limits<double>::quiet_NaN();
  options_.on_step(event);
}

void TrainingRun::log_step(const UnresolvedStep& done, const StepResult& result,
                           const StepTelemetry& telemetry, double throughput) {
  nlohmann::json record = telemetry.to_json();
  record["event"] = "step";
  record["step"] = done.step;
  record["loss"] = std::isfinite(step_loss_) ? nlohmann::json(step_loss_)
                                             : nlohmann::json(std::to_string(step_loss_));
  const std::optional<double> window_loss = stats_.take_window_loss();
  record["train_loss"] = window_loss ? nlohmann::json(*window_loss) : nlohmann::json(nullptr);
  record["lr"] = done.lr_after;
  record["skipped_steps"] = position_.skipped_steps;
  record["step_ms"] = done.seconds * 1000.0;
  record["elapsed_s"] = position_.train_seconds;
  record["epoch"] = (done.next_batch - 1) / s_.data->batches_per_epoch();
  record[classification_ ? "samples_per_s" : "tokens_per_s"] = throughput;
  if (!s_.device.is_cpu()) {
    const uint64_t syncs = device_host_syncs(s_.device);
    record["host_syncs_per_step"] = static_cast<double>(syncs - syncs_at_last_log_) /
                                    static_cast<double>(done.step - step_at_last_log_);
    syncs_at_last_log_ = syncs;
    step_at_last_log_ = done.step;
  }
  guard_->annotate(record);
  write_record(record);
  if (result.skipped()) {
    progress_.message("step " + std::to_string(done.step) + " skipped: " + result.reason);
  }
}

void TrainingRun::show_progress(const UnresolvedStep& done, const StepResult& result,
                                const StepTelemetry& telemetry, double throughput) {
  ProgressLine line;
  line.step = done.step;
  line.total = total_steps_;
  line.loss = step_loss_;
  line.loss_step = loss_step_;
  line.scale = telemetry.next_scale;
  line.lr = done.lr_after;
  line.throughput = throughput;
  line.unit = classification_ ? "samples/s" : "tokens/s";
  line.eta_s = stats_.recent_step_seconds() * static_cast<double>(total_steps_ - done.step);
  line.skipped = result.skipped();
  progress_.step(line);
}

void TrainingRun::evaluate(int64_t step) {
  last_eval_ = mixprec::evaluate(*s_.model, *s_.data, s_.device, s_.precision.working_dtype());
  evaluated_ = true;
  write_record(eval_record(step, last_eval_, classification_));
  char text[128];
  std::snprintf(text, sizeof text, "eval at step %lld: val_loss %.4f%s",
                static_cast<long long>(step), last_eval_.loss,
                classification_
                    ? (", val_accuracy " + std::to_string(last_eval_.accuracy)).c_str()
                    : "");
  progress_.message(text);
}

void TrainingRun::write_record(const nlohmann::json& record) {
  metrics_->write(record);
  if (tensorboard_) tensorboard_->write(record);
}

std::string TrainingRun::save(int64_t step) {
  if (writes()) return save_checkpoint(checkpoints_dir_, step, checkpoint_state(),
                                       config_.checkpoint.keep);
  if (shards_) checkpoint_state();  // the gather needs every rank
  return checkpoint_folder(checkpoints_dir_, step);
}

void TrainingRun::checkpoint(int64_t step) {
  check_ranks_agree(step);
  save(step);
  last_saved_ = step;
}

void TrainingRun::check_ranks_agree(int64_t step) {
  if (ranks_->size() == 1) return;
  // FNV-1a over the masters' bytes and the scaler's state: a cheap fingerprint whose
  // disagreement means that the ranks' weights parted ways.
  uint64_t hash = 14695981039346656037ULL;
  auto mix = [&hash](const uint8_t* bytes, size_t n) {
    for (size_t i = 0; i < n; ++i) hash = (hash ^ bytes[i]) * 1099511628211ULL;
  };
  for (const Parameter& p : s_.params) {
    const Tensor master = p.master().to(kCPU);
    mix(static_cast<const uint8_t*>(master.data()), static_cast<size_t>(master.numel()) * 4);
  }
  const std::string scaler = scaler_.state_dict().dump();
  mix(reinterpret_cast<const uint8_t*>(scaler.data()), scaler.size());
  const std::vector<int64_t> hashes = ranks_->all_gather_int(static_cast<int64_t>(hash));
  for (size_t r = 1; r < hashes.size(); ++r) {
    MIXPREC_CHECK(hashes[r] == hashes[0], "after step ", step, " the weights or loss-scale state "
                  "of rank ", r, " differ from rank 0's (fingerprints ", hashes[r], " and ",
                  hashes[0], "); the ranks no longer train one model, so the run stops");
  }
}

void TrainingRun::stop_at(int64_t step) {
  progress_.finish();
  const std::string saved = save(step);
  guard_->stop(step, scaler_, saved, *metrics_);  // writes the "stopped" record, throws
}

void TrainingRun::stop_if_interrupted(int64_t step, bool last) {
  // The ranks stop after the same step: a signal seen by any of them stops all.
  int signal = interrupt_signal();
  if (ranks_->size() > 1) {
    for (int64_t seen : ranks_->all_gather_int(signal)) signal = signal != 0 ? signal : static_cast<int>(seen);
  }
  if (signal == 0 || last) return;
  resolve();
  progress_.finish();
  if (last_saved_ != step) checkpoint(step);
  throw TrainingInterrupted(signal, step, total_steps_, run_dir_,
                            checkpoint_folder(checkpoints_dir_, step));
}

nlohmann::json TrainingRun::finish() {
  progress_.finish();
  if (!evaluated_) {
    last_eval_ = mixprec::evaluate(*s_.model, *s_.data, s_.device, s_.precision.working_dtype());
  }
  if (last_saved_ != position_.step) checkpoint(position_.step);

  const double median_s = stats_.median_step_seconds();
  const std::optional<double> train_loss = stats_.recent_loss();
  nlohmann::json summary{
      {"name", config_.name},
      {"run_dir", run_dir_},
      {"steps", position_.step},
      {"skipped_steps", position_.skipped_steps},
      {"final_scale", scaler_.scale_value()},
      {"train_loss", train_loss ? nlohmann::json(*train_loss) : nlohmann::json(nullptr)},
      {"val_loss", last_eval_.loss},
      {"median_step_ms", median_s * 1000.0},
      {"train_seconds", position_.train_seconds},
      {"precision", config_.precision},
      {"tf32", config_.tf32},
      {"device", s_.device.str()},
      {"parameters", s_.model->parameter_count()},
      {"batch_size", config_.train.batch_size},
      {"accumulation_steps", config_.train.accumulation_steps},
  };
  if (!s_.device.is_cpu() && position_.step > first_step_) {
    // Evaluations and checkpoints wait for the device too; they are counted in.
    summary["host_syncs_per_step"] =
        static_cast<double>(device_host_syncs(s_.device) - syncs_at_start_) /
        static_cast<double>(position_.step - first_step_);
  }
  if (recorded_) {
    // Steps taken by a replay; a recording is made once per window (and its step replayed).
    summary["cuda_graph"] = {{"recordings", recorded_->recordings()},
                             {"replays", recorded_->replays()}};
  }
  const double per_s =
      median_s > 0 ? static_cast<double>(samples_per_step_) / median_s : 0.0;
  if (classification_) {
    summary["val_accuracy"] = last_eval_.accuracy;
    summary["samples_per_s"] = per_s;
  } else {
    summary["tokens_per_s"] = per_s * static_cast<double>(tokens_per_sample_);
  }
  if (ranks_->size() > 1) {
    summary["ranks"] = ranks_->size();
    summary["distributed_backend"] = ranks_->backend();
    summary["shard_optimizer"] = shards_.has_value();
    // The optimizer state rank 0 holds: all of it replicated, its owners' share sharded.
    summary["optimizer_state_bytes"] = optimizer_state_bytes(*optimizer_);
    // Rank 0's wall time in the step's exchanges (gradients, loss, batch-norm statistics).
    if (position_.step > first_step_)
      summary["exchange_ms_per_step"] =
          sync_->seconds() * 1000.0 / static_cast<double>(position_.step - first_step_);
  }
  const std::string summary_text = summary.dump(2) + "\n";
  if (writes())
    write_file_atomic((fs::path(run_dir_) / "summary.json").string(), summary_text.data(),
                      summary_text.size());
  return summary;
}

}  // namespace

nlohmann::json run_training(const TrainOptions& options, std::ostream& log) {
  TrainingRun run(options, log);
  mark_setup_done();
  while (!run.done()) run.step();
  return run.finish();
}

}  // namespace mixprec
