// The handler may run on any thread (the prefetcher's, OpenMP's) and between any two
// instructions of the loop, so it touches only lock-free atomics and calls only write(2) and
// _exit(2), which are async-signal-safe; everything else happens in the trainer when it next
// looks at the record.
#include "apps/train/interrupt.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "apps/train/rank_output.h"
#include "core/error.h"

namespace mixprec {
namespace {

static_assert(std::atomic<int>::is_always_lock_free,
              "the signal handler needs a lock-free atomic int");

std::atomic<int> g_first_signal{0};  // the first signal received, 0 before
std::atomic<int> g_count{0};         // signals received since the guard was installed
std::atomic<bool> g_installed{false};
// The ranks other than 0 of `mpirun -np N` keep quiet: rank 0 says it for the job.
std::atomic<bool> g_quiet{false};

// Fixed texts: the handler cannot format. Each starts with a newline, since a progress bar
// may be half drawn on the terminal.
constexpr char kFirstInt[] =
    "\nmixprec: SIGINT received; finishing this step and saving a checkpoint "
    "(press Ctrl-C again to stop at once)\n";
constexpr char kFirstTerm[] =
    "\nmixprec: SIGTERM received; finishing this step and saving a checkpoint "
    "(send it again to stop at once)\n";
constexpr char kSecond[] =
    "\nmixprec: second signal; stopping at once (the last complete checkpoint is kept)\n";

void write_all(const char* text, size_t size) {
  while (size > 0) {
    const ssize_t written = ::write(STDERR_FILENO, text, size);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return;  // nothing else to do about a closed stderr
    text += written;
    size -= static_cast<size_t>(written);
  }
}

extern "C" void on_interrupt(int signal) {
  const int saved_errno = errno;  // the interrupted code may be about to read errno
  if (g_count.fetch_add(1) == 0) {
    g_first_signal.store(signal);
    if (g_quiet.load()) {
      // Nothing to say.
    } else if (signal == SIGINT) {
      write_all(kFirstInt, sizeof kFirstInt - 1);
    } else {
      write_all(kFirstTerm, sizeof kFirstTerm - 1);
    }
    errno = saved_errno;
    return;
  }
  write_all(kSecond, sizeof kSecond - 1);
  ::_exit(128 + signal);
}

void install(int signal, struct sigaction* previous) {
  struct sigaction action {};
  action.sa_handler = on_interrupt;
  // SA_RESTART: a read, write or fsync of a save goes on rather than failing with EINTR.
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  sigaddset(&action.sa_mask, SIGINT);
  sigaddset(&action.sa_mask, SIGTERM);
  if (::sigaction(signal, &action, previous) != 0) {
    const int error = errno;
    MIXPREC_FAIL("cannot install the handler for ", signal_name(signal), ": ",
                 std::strerror(error));
  }
}

// Words that a POSIX shell reads as themselves; anything else is single-quoted.
std::string shell_word(const std::string& word) {
  const bool plain = !word.empty() && word.find_first_not_of(
                                          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                          "0123456789_-./=:,+@%") == std::string::npos;
  if (plain) return word;
  std::string quoted = "'";
  for (char c : word) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  return quoted + "'";
}

}  // namespace

InterruptGuard::InterruptGuard() {
  if (g_installed.exchange(true)) return;
  g_quiet.store(launcher_rank() != 0);
  g_count.store(0);
  g_first_signal.store(0);
  try {
    install(SIGINT, &previous_int_);
    install(SIGTERM, &previous_term_);
  } catch (...) {
    ::sigaction(SIGINT, &previous_int_, nullptr);
    g_installed.store(false);
    throw;
  }
  installed_ = true;
}

InterruptGuard::~InterruptGuard() {
  if (!installed_) return;
  ::sigaction(SIGINT, &previous_int_, nullptr);
  ::sigaction(SIGTERM, &previous_term_, nullptr);
  g_installed.store(false);
}

int interrupt_signal() { return g_first_signal.load(std::memory_order_relaxed); }

std::string signal_name(int signal) {
  if (signal == SIGINT) return "SIGINT";
  if (signal == SIGTERM) return "SIGTERM";
  return "signal " + std::to_string(signal);
}

TrainingInterrupted::TrainingInterrupted(int signal, int64_t step, int64_t total_steps,
                                         std::string run_dir, std::string checkpoint)
    : signal_(signal),
      step_(step),
      total_steps_(total_steps),
      run_dir_(std::move(run_dir)),
      checkpoint_(std::move(checkpoint)),
      what_("interrupted (" + signal_name(signal) + ") at step " + std::to_string(step) +
            " of " + std::to_string(total_steps)) {}

std::string interrupted_message(const TrainingInterrupted& interrupted,
                                const std::string& config_path,
                                const std::vector<std::string>& overrides) {
  if (interrupted.checkpoint().empty()) {
    return "interrupted (" + signal_name(interrupted.signal()) +
           ") before training started; nothing was written to " + interrupted.run_dir();
  }
  std::string command = "mixprec train " + shell_word(config_path) + " --resume " +
                        shell_word(interrupted.run_dir());
  for (const std::string& value : overrides) command += " --set " + shell_word(value);
  return "interrupted at step " + std::to_string(interrupted.step()) + " of " +
         std::to_string(interrupted.total_steps()) + "; checkpoint " +
         interrupted.checkpoint() + "; resume with: " + command;
}

}  // namespace mixprec
