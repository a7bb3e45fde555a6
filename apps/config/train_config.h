// The training config: every section of a YAML config as plain values, with defaults, and
// the loader that validates a file against it.
//
// Loading rules (all errors are mixprec::Error, caught by the CLI as exit code 2):
// - Malformed YAML: "<path>:<line>:<col>: <parser message>".
// - An unknown key names its full path and, when a known key is within edit distance 2,
//   suggests it: "config.yaml: unknown key 'optimizer.lerning_rate' (did you mean 'lr'?)".
// - A wrong type names the key, the expected type and what was found: "train.batch_size:
//   expected an integer, got 'abc'".
// - An out-of-range value names the key, the range and the value: "train.batch_size must be
//   >= 1, got 0".
// - Relative data paths are resolved against the config file's folder first, then the
//   working directory; a data file that exists in neither is an error naming both places.
// - `overrides` are "key.path=value" strings (the CLI's --set), applied to the YAML tree
//   before validation; the value is parsed as YAML ("train.steps=100", "precision=bf16",
//   "optimizer.betas=[0.9,0.95]"). A malformed override ("noequals") is an error.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "layers/model_spec.h"

namespace mixprec {

struct ModelConfig {
  enum class Type { Cnn, Gpt };
  Type type = Type::Cnn;
  CnnSpec cnn;  // type cnn: in_channels, input_size, layers
  GptSpec gpt;  // type gpt
};

struct DataConfig {
  enum class Kind { Idx, CharText };
  Kind kind = Kind::Idx;  // `kind: idx | text`
  // idx: absolute paths after loading
  std::string train_images, train_labels, test_images, test_labels;
  int64_t num_classes = 10;
  std::optional<double> mean, std;  // `normalize: {mean, std}`
  int64_t limit_train = 0, limit_test = 0;
  // text
  std::string path;
  double val_fraction = 0.1;
  int64_t eval_batches = 20;
  // both
  bool shuffle = true;
};

struct LossScaleConfig {
  // auto | dynamic | static | none; auto is dynamic for fp16 and none for fp32 and bf16
  // (effective_loss_scale_policy), with the settings below either way.
  std::string policy = "auto";
  double init_scale = 65536.0;  // dynamic: initial S; static: the S
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  int64_t hysteresis = 1;
  std::string hysteresis_mode = "reset_on_growth";  // reset_on_growth | consecutive
  double min_scale = 1.0;      // dynamic: floor
  double max_scale = 16777216.0;  // 2^24
  std::string floor_policy = "clamp";  // clamp | warn | error
};

struct OptimizerConfig {
  std::string type = "sgd";  // sgd | adam | adamw
  double lr = 0.01;
  double momentum = 0.0;     // sgd
  bool nesterov = false;     // sgd
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999;  // `betas: [b1, b2]`
  double eps = 1e-8;
};

struct ScheduleConfig {
  std::string type = "constant";  // constant | step | cosine
  int64_t step_size = 1000;       // step
  double gamma = 0.1;             // step
  int64_t warmup_steps = 0;       // cosine
  int64_t decay_steps = 0;        // cosine; 0 = the run's total steps
  double min_lr = 0.0;            // cosine
};

struct TrainLoopConfig {
  int64_t epochs = 0;  // exactly one of epochs / steps is > 0 (steps = optimizer steps)
  int64_t steps = 0;
  int64_t batch_size = 128;  // per microbatch
  int64_t accumulation_steps = 1;
  double clip_grad_norm = 0.0;  // 0 = off
  uint64_t seed = 0;
  int64_t eval_every = 0;  // optimizer steps; 0 = only at the end
  int64_t log_every = 50;
  // After this many skipped steps in a row (overflows, non-finite losses, input batches with
  // Inf/NaN) the run stops with a diagnostic, exit code 3; 0 = never stop.
  int64_t max_consecutive_skips = 100;
  // When the host learns each step's outcome (skipped or not, the scale, the clip norm), which
  // is decided on the device either way (amp/deferred_steps.h): "per_step" reads it after
  // every step; "at_log" only at log, eval and checkpoint steps, so a GPU never waits between
  // them; "auto" is at_log on a GPU and per_step on the CPU, where reading costs nothing.
  // The weights are the same bits in every mode.
  std::string host_reads = "auto";
  // On a GPU with deferred steps (host_reads at_log or auto): the step is recorded as a CUDA
  // graph once per window between two host reads and replayed for the window's other steps,
  // one launch instead of hundreds (apps/train/recorded_step.h). The same steps, bit for bit.
  bool cuda_graph = false;
};

struct CheckpointConfig {
  int64_t every = 0;  // optimizer steps; 0 = only at the end
  int64_t keep = 3;   // newest N kept; 0 = keep all
  bool save_initial = false;
};

// `distributed:` data parallelism over the ranks that `mpirun -np N` starts (dist/). Each
// rank computes train.batch_size examples per microbatch, so a step sees batch_size x
// accumulation_steps x N examples.
struct DistributedConfig {
  std::string backend = "auto";  // auto | none | mpi | nccl (dist/communicator.h)
  double timeout_s = 300.0;      // every collective's watchdog limit, > 0
  bool shard_optimizer = false;  // each rank owns a share of the FP32 masters and their state
};

// `inject_nonfinite: {step, tensor, value, rank}` puts Inf or NaN into one step, to see what the
// run does with it. `tensor` is one of:
// - a parameter name (e.g. 0.weight): the first element of its gradient after backward, as an
//   overflow in backward would leave it;
// - `loss`: the loss of the step's first microbatch is multiplied by the value before
//   backward, so the loss and every gradient that depends on it are non-finite;
// - `input`: the first element of the step's first input batch, which the host-side input
//   check then finds (image data only; token ids cannot hold Inf or NaN).
struct DebugConfig {
  bool detect_anomaly = false;
  int64_t inject_step = -1;    // -1 = off
  std::string inject_tensor;   // a parameter name, `loss` or `input`
  std::string inject_value = "inf";  // inf | nan
  int64_t inject_rank = -1;          // the rank that injects; -1 = every rank
};

// What a run records beside metrics.jsonl and summary.json.
struct LogConfig {
  // A TensorBoard event file in the run folder with the logged scalars, flushed at every log
  // step (apps/tensorboard/metrics_events.h), and `mixprec inspect`'s gradient histograms in
  // its report folder.
  bool tensorboard = true;
};

struct TrainConfig {
  std::string source_path;  // the file it was loaded from
  std::string name;         // `name:` or the file's stem
  ModelConfig model;
  DataConfig data;
  std::string precision = "fp32";  // fp32 | fp16 | bf16
  // Whether FP32 GEMMs and convolutions on a GPU may run on TF32 tensor cores (inputs rounded
  // to 10-bit mantissas): off by default for both, as PyTorch's matmuls since 1.12 (PyTorch's
  // cuDNN convolutions still default to TF32); summary.json and bench.json say which. The CPU
  // backend always computes full FP32.
  bool tf32 = false;
  LossScaleConfig loss_scale;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  TrainLoopConfig train;
  CheckpointConfig checkpoint;
  std::string device = "cpu";  // cpu | cuda | auto
  LogConfig log;
  DistributedConfig distributed;
  DebugConfig debug;
};

TrainConfig load_train_config(const std::string& path,
                              const std::vector<std::string>& overrides = {});
// The same from YAML text (`origin` names it in messages; relative paths resolve against
// `base_dir`).
TrainConfig parse_train_config(const std::string& yaml_text, const std::string& origin,
                               const std::string& base_dir,
                               const std::vector<std::string>& overrides = {});
// The policy `policy` stands for at `precision`: auto is dynamic for fp16 (the one format
// whose gradients underflow) and none for fp32 and bf16, as PrecisionPolicy's default; the
// others are themselves.
std::string effective_loss_scale_policy(const std::string& policy, const std::string& precision);
// Whether the --set texts `overrides` give `key_path` (dotted keys, no indices:
// "train.log_every") a value, read as the loader reads them: keys are trimmed, a later text
// wins, and a map set at a parent path counts if it holds the key ("train={log_every: 5}"
// does; "train={steps: 9}" does not, and it removes what an earlier text gave the section).
// A text the loader would refuse gives nothing here (loading the config reports it).
bool overrides_set_key(const std::vector<std::string>& overrides, const std::string& key_path);
// Every setting, defaults included, as YAML that load_train_config reads back to the same
// TrainConfig (the run directory's config.yaml).
std::string to_yaml(const TrainConfig& config);

}  // namespace mixprec
