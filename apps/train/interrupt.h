// Ctrl-C (SIGINT) and `kill` (SIGTERM) during `mixprec train`.
//
// While an InterruptGuard lives, the first of these signals only records itself (and says on
// stderr that the run is stopping): the trainer finishes the step in progress, with its
// evaluation and checkpoint if it has them, saves a checkpoint of that step unless it was
// just saved, and throws TrainingInterrupted; the CLI prints how to resume and exits with
// 128 + the signal (130 for SIGINT, 143 for SIGTERM), as a shell reports a process that a
// signal stopped. A second signal ends the process at once with _exit(128 + that signal):
// a checkpoint being written is left as its hidden temporary folder, and the checkpoints
// before it are untouched (see apps/checkpoint/checkpoint_dir.h).
#pragma once

#include <signal.h>

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

namespace mixprec {

// Installs the handlers for SIGINT and SIGTERM (sigaction, SA_RESTART, so that the file
// writes of a save are not cut short) and clears the record of earlier signals; restores
// the previous handlers when it dies. A guard made while another lives does nothing, so
// nested calls keep the outer one's handlers and record.
class InterruptGuard {
 public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

 private:
  bool installed_ = false;
  struct sigaction previous_int_ {};
  struct sigaction previous_term_ {};
};

// The first SIGINT or SIGTERM received since the guard was installed, or 0. Cheap (one
// atomic load): the trainer asks at the end of every step.
int interrupt_signal();

// "SIGINT", "SIGTERM", or "signal <n>".
std::string signal_name(int signal);

// Thrown by run_training after an interrupt. `checkpoint` is the step_<N> folder that holds
// the state after `step`; empty when the signal came before training started (then nothing
// was written to the run folder).
class TrainingInterrupted : public std::exception {
 public:
  TrainingInterrupted(int signal, int64_t step, int64_t total_steps, std::string run_dir,
                      std::string checkpoint);

  int signal() const noexcept { return signal_; }
  int exit_code() const noexcept { return 128 + signal_; }  // 130 for SIGINT, 143 for SIGTERM
  int64_t step() const noexcept { return step_; }
  int64_t total_steps() const noexcept { return total_steps_; }
  const std::string& run_dir() const noexcept { return run_dir_; }
  const std::string& checkpoint() const noexcept { return checkpoint_; }
  // "interrupted (SIGINT) at step N of M"
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  int signal_;
  int64_t step_;
  int64_t total_steps_;
  std::string run_dir_;
  std::string checkpoint_;
  std::string what_;
};

// What the CLI prints: "interrupted at step N of M; checkpoint <dir>; resume with: mixprec
// train <config> --resume <run_dir> --set ..." with the --set flags of the interrupted run,
// each word quoted for a POSIX shell where it needs to be. Before training started: that
// nothing was written.
std::string interrupted_message(const TrainingInterrupted& interrupted,
                                const std::string& config_path,
                                const std::vector<std::string>& overrides);

}  // namespace mixprec
