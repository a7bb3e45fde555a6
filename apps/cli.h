// The `mixprec` command line: parses arguments and runs one subcommand.
#pragma once

#include <iosfwd>

namespace mixprec {

// Runs the command line `argv` (argv[0] is the program name), writing results to `out` and
// diagnostics to `err`. Returns the process exit code:
//   0  success, and for --help / --version
//   2  bad input: unknown subcommand or option, missing or invalid argument, or a
//      mixprec::Error thrown by the command, a file-system error on a path the user gave, or
//      memory exhausted by the sizes asked for; one line "error: <message>" goes to `err`
//   3  a training run stopped because it could not make progress (train.max_consecutive_skips
//      skipped steps in a row); it saved a checkpoint of the last good weights first
//   128 + signal  a run stopped by SIGINT (130) or SIGTERM (143), after saving a checkpoint
//   1  any other exception (a defect), reported as "internal error: <message>"
// Never lets an exception escape.
int run_cli(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

}  // namespace mixprec
