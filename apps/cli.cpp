#include "apps/cli.h"

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <new>
#include <functional>
#include <iostream>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "apps/cli_study_commands.h"
#include "apps/explain/topics.h"
#include "apps/sample/sample_command.h"
#include "apps/train/interrupt.h"
#include "apps/train/rank_output.h"
#include "apps/train/trainer.h"
#include "apps/train/training_stopped.h"
#include "dist/communicator.h"
#include "core/error.h"

#include "core/cpu/bf16_dot_gemm.h"
#include "core/cpu/f16_gemm.h"

#if MIXPREC_WITH_CUDA
#include "core/backend.h"
#include "cuda/device_query.h"
#endif

#ifndef MIXPREC_VERSION
#define MIXPREC_VERSION "unknown"
#endif

namespace mixprec {
namespace {

constexpr int kExitBadInput = 2;
constexpr int kExitInternalError = 1;

std::string version_text() {
  std::string text = "mixprec " MIXPREC_VERSION;
#if MIXPREC_WITH_CUDA
  text += " (CUDA backend)";
#else
  text += " (CPU only, built without CUDA)";
#endif
  return text;
}

// "mixprec explain": the command path of `command`, for messages.
std::string command_path(const CLI::App* command) {
  std::string path = command->get_name();
  for (const CLI::App* parent = command->get_parent(); parent != nullptr; parent = parent->get_parent()) {
    path = parent->get_name() + " " + path;
  }
  return path;
}

// "explain, device": the subcommands `command` accepts.
std::string subcommand_names(CLI::App* command) {
  std::string names;
  for (const CLI::App* sub : command->get_subcommands([](CLI::App*) { return true; })) {
    if (!names.empty()) names += ", ";
    names += sub->get_name();
  }
  return names;
}

// The most nested subcommand given on the command line (the app itself when none was).
CLI::App* deepest_command(CLI::App& app) {
  CLI::App* command = &app;
  for (auto chosen = command->get_subcommands(); !chosen.empty(); chosen = command->get_subcommands()) {
    command = chosen.front();
  }
  return command;
}

// CLI11 reports a stray word as "arguments were not expected"; say instead which command did
// not know it and what it accepts.
std::string stray_argument_message(CLI::App& app) {
  CLI::App* command = deepest_command(app);
  const std::vector<std::string> stray = app.remaining(true);
  const std::string first = stray.empty() ? std::string() : stray.front();
  const std::string accepted = subcommand_names(command);
  if (!first.empty() && first.front() == '-') {
    return "unknown option '" + first + "' for `" + command_path(command) + "`";
  }
  if (!accepted.empty()) {
    return "unknown command '" + first + "' for `" + command_path(command) + "` (expected one of: " +
           accepted + ")";
  }
  return "unexpected argument '" + first + "' for `" + command_path(command) + "`";
}

// The devices and libraries, then whether the CUDA backend is registered (the `mixprec`
// program registers it at start-up when a device is present), so that a run on a GPU machine
// shows at once whether tensors can go to cuda:0.
std::string device_text() {
  const std::string cpu_line = "CPU: BF16 products: " + cpu::bf16_products_path() +
                               "; FP16 products: " + cpu::f16_products_path() + "\n";
#if MIXPREC_WITH_CUDA
  std::string text = cpu_line + cuda_status_line() + "\n";
  if (has_backend(DeviceType::CUDA)) {
    text += "CUDA backend: registered for cuda:0";
  } else if (cuda_device_count() == 0) {
    text += "CUDA backend: not registered (no usable CUDA device)";
  } else {
    text += "CUDA backend: not registered (a device is present but was not set up)";
  }
  return text;
#else
  return cpu_line + "built without CUDA";
#endif
}

// A message on one line, as the exit-code contract promises: multi-line messages (lists of
// keys from load_state_dict, for one) become "first; header: item; item".
std::string one_line(const std::string& message) {
  std::string line;
  for (size_t i = 0; i < message.size(); ++i) {
    if (message[i] != '\n') {
      line += message[i];
      continue;
    }
    while (i + 1 < message.size() && (message[i + 1] == ' ' || message[i + 1] == '\t')) ++i;
    if (!line.empty() && line.back() == ':') {
      line += ' ';
    } else if (!line.empty() && i + 1 < message.size()) {
      line += "; ";
    }
  }
  return line;
}

// The exit codes of a run stopped by SIGINT or SIGTERM (128 + signal), which stops every rank
// of mpirun at one step.
bool interrupted_exit(int code) { return code == 128 + SIGINT || code == 128 + SIGTERM; }

// run_cli for one process, or for rank 0 of several.
int run_command(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

}  // namespace

int run_cli(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  int code = 0;
  if (launcher_rank() == 0) {
    code = run_command(argc, argv, out, err);
  } else {
    // The other ranks of `mpirun -np N`: nothing on stdout, and their errors only, each line
    // prefixed with the rank (apps/train/rank_output.h).
    std::ostream silent(nullptr);
    std::ostringstream errors;
    code = run_command(argc, argv, silent, errors);
    // An interrupt stops every rank at one step, and rank 0 says so for all.
    if (code != 0 && !interrupted_exit(code) && reports_errors()) {
      std::istringstream lines(errors.str());
      for (std::string line; std::getline(lines, line);) err << error_prefix() << line << "\n";
    }
  }
  // A rank that stops on its own after setup takes the others with it. (Before, every rank
  // meets the same error and exits by itself.) An interrupt, or a run that cannot make
  // progress, stops every rank at one step.
  if (code != 0 && code != kExitTrainingStopped && !interrupted_exit(code) && setup_done()) {
    err.flush();
    dist::end_every_rank(code);
  }
  return code;
}

namespace {

int run_command(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  CLI::App app{"mixprec: mixed-precision training, benchmarks and lessons", "mixprec"};
  app.set_version_flag("--version", version_text(), "Print the version and exit");
  // At most one command per level. A missing one is reported after parsing rather than by
  // CLI11, whose check runs before unknown words are and so would hide a misspelt command.
  app.require_subcommand(0, 1);

  // Each command sets `action`; it runs after parsing succeeded, outside CLI11, so that its
  // own errors are told apart from bad arguments.
  std::function<void()> action;

  CLI::App* explain = app.add_subcommand("explain", "Lessons on mixed precision, computed by mixprec itself");
  explain->require_subcommand(0, 1);
  // Only one topic is parsed per run, so every topic's --json can share one flag variable.
  bool explain_json = false;
  for (const explain::Topic& topic : explain::topics()) {
    CLI::App* command = explain->add_subcommand(std::string(topic.name), std::string(topic.summary));
    command->add_flag("--json", explain_json, "Print the lesson's results as one JSON object");
    command->callback([&, topic] {
      action = [&, topic] {
        if (explain_json) {
          out << topic.json().dump(2) << "\n";
        } else {
          out << topic.text();
        }
      };
    });
  }

  TrainOptions train_options;
  CLI::App* train = app.add_subcommand("train", "Train a model from a YAML config");
  train->add_option("config", train_options.config_path, "The YAML config file")->required();
  train->add_option("--set", train_options.overrides,
                    "Override a setting, e.g. --set train.steps=100 (repeatable)")
      ->allow_extra_args(false);
  train->add_option("--out", train_options.out_dir,
                    "Run folder (default runs/<name>-<date>-<time>)");
  train->add_option("--resume", train_options.resume_dir,
                    "Continue the run in this folder from its newest checkpoint");
  train->callback([&] {
    action = [&] {
      // A bar only when the output is this process's terminal; plain lines otherwise.
      train_options.progress_bar = &out == &std::cout && ::isatty(STDOUT_FILENO) == 1;
      const nlohmann::json summary = run_training(train_options, out);
      out << "summary (" << summary["run_dir"].get<std::string>() << "/summary.json): "
          << summary.dump() << "\n";
    };
  });

  EvalOptions eval_options;
  CLI::App* eval = app.add_subcommand("eval", "Evaluate a checkpoint on the validation/test split");
  eval->add_option("config", eval_options.config_path, "The YAML config file")->required();
  eval->add_option("--checkpoint", eval_options.checkpoint,
                   "A checkpoint folder (step_N) or a run folder (its newest checkpoint)")
      ->required();
  eval->add_option("--set", eval_options.overrides, "Override a setting (repeatable)")
      ->allow_extra_args(false);
  eval->callback([&] {
    action = [&] { out << run_evaluation(eval_options).dump(2) << "\n"; };
  });

  SampleOptions sample_options;
  bool no_cache = false;
  CLI::App* sample = app.add_subcommand("sample", "Generate text from a trained GPT's checkpoint");
  sample->add_option("config", sample_options.config_path, "The YAML config of the run")->required();
  sample->add_option("--checkpoint", sample_options.checkpoint,
                     "A checkpoint folder (step_N) or a run folder (its newest checkpoint)")
      ->required();
  sample->add_option("--prompt", sample_options.prompt, "Text to continue (default: a newline)");
  sample->add_option("--tokens", sample_options.tokens, "Tokens to generate (default 500)");
  sample->add_option("--temperature", sample_options.choice.temperature,
                     "Divides the logits: below 1 sharper, above 1 flatter (default 0.8)");
  sample->add_option("--top-k", sample_options.choice.top_k,
                     "Sample among the K most likely tokens only (default 200)");
  sample->add_option("--seed", sample_options.seed, "Seed of the draws (default 1337)");
  sample->add_option("--precision", sample_options.precision, "fp32, fp16 or bf16 (default: the config's)");
  sample->add_option("--device", sample_options.device, "cpu, cuda or auto (default: the config's)");
  sample->add_flag("--no-cache", no_cache,
                   "Run the whole context for every token instead of reading one position with a "
                   "key/value cache (for comparison)");
  sample->add_option("--set", sample_options.overrides, "Override a setting (repeatable)")
      ->allow_extra_args(false);
  sample->callback([&] {
    action = [&] {
      sample_options.use_cache = !no_cache;
      const SampleResult result = run_sampling(sample_options, out);
      out << "\n";
      char rate[96];
      std::snprintf(rate, sizeof rate, "%lld tokens in %.3f s, %.0f tokens/s",
                    static_cast<long long>(result.tokens), result.seconds,
                    static_cast<double>(result.tokens) / result.seconds);
      err << "sample: " << rate << " (" << (sample_options.use_cache ? "key/value cache" : "no cache")
          << ", " << result.device << ", " << result.precision << ")\n";
    };
  });

  add_bench_command(app, action, out, err);
  add_inspect_command(app, action, out);

  app.add_subcommand("device", "Show the CUDA devices and library versions this build can use")
      ->callback([&] { action = [&] { out << device_text() << "\n"; }; });

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help and --version
    return app.exit(e, out, err);
  } catch (const CLI::ExtrasError&) {
    err << "error: " << stray_argument_message(app) << "\n";
    return kExitBadInput;
  } catch (const CLI::ParseError& e) {
    err << "error: " << e.what() << " (run `mixprec --help` for usage)\n";
    return kExitBadInput;
  }
  if (!action) {
    CLI::App* command = deepest_command(app);
    err << "error: `" << command_path(command) << "` needs a command, one of: "
        << subcommand_names(command) << " (run `" << command_path(command) << " --help` for usage)\n";
    return kExitBadInput;
  }

  try {
    action();
    out.flush();
    return 0;
  } catch (const TrainingInterrupted& e) {
    // Ctrl-C or kill: the step was finished and saved; exit as a shell reports the signal.
    out.flush();
    if (train_options.config_path.empty()) {  // `bench`: one of its runs was stopped
      err << e.what() << " in " << e.run_dir() << "; bench stopped\n";
    } else {
      err << interrupted_message(e, train_options.config_path, train_options.overrides) << "\n";
    }
    return e.exit_code();
  } catch (const TrainingStopped& e) {
    // Not bad input: the run started and could not make progress (kExitTrainingStopped).
    err << "error: " << one_line(e.what()) << "\n";
    return kExitTrainingStopped;
  } catch (const Error& e) {
    err << "error: " << one_line(e.what()) << "\n";
    return kExitBadInput;
  } catch (const std::filesystem::filesystem_error& e) {
    // A path the user gave that cannot be read or written (permissions, a file where a
    // folder should be, a full disk): bad input, not a defect.
    err << "error: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const std::bad_alloc&) {
    err << "error: out of memory; use a smaller model, batch_size or data limit\n";
    return kExitBadInput;
  } catch (const std::exception& e) {
    err << "internal error: " << e.what() << "\n";
    return kExitInternalError;
  }
}

}  // namespace
}  // namespace mixprec
