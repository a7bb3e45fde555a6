#include <csignal>
#include <exception>
#include <iostream>

#include "apps/cli.h"

#if MIXPREC_WITH_CUDA
#include "cuda/register.h"
#endif

int main(int argc, char** argv) {
  // A reader of the console output that goes away (`| head`, a `| tee` stopped by the same
  // Ctrl-C) must not end a run by signal: with SIGPIPE ignored a write to the closed pipe only
  // fails, the run goes on to its checkpoints and records, and the loss is reported below.
  std::signal(SIGPIPE, SIG_IGN);
#if MIXPREC_WITH_CUDA
  // Before any command runs, so that every command can place tensors on cuda:0. Without a
  // device this returns false and the program stays on the CPU; a device that exists but
  // cannot be set up is reported, and the CPU still works (`mixprec device` says why).
  try {
    mixprec::register_cuda_backend();
  } catch (const std::exception& e) {
    std::cerr << "warning: the CUDA backend could not be set up, running on the CPU only: "
              << e.what() << "\n";
  }
#endif
  const int status = mixprec::run_cli(argc, argv, std::cout, std::cerr);
  std::cout.flush();
  if (!std::cout) {
    std::cerr << "warning: standard output could not be written (closed or full) before mixprec "
                 "finished, so some of its console output was lost; a training run's records "
                 "are in its run folder (metrics.jsonl, summary.json, checkpoints/)\n";
  }
  return status;
}
