// Where the CUDA backend's at-exit reports go (the kernel profile, the autotuning log): a
// file named by an environment variable, or standard error for "-".
#pragma once

#include <string>

namespace mixprec {

// Writes `text` to `path` ("-": standard error); when the file cannot be written, says so
// on standard error, naming `variable` (the environment variable that named the path), and
// returns: a report must never fail the run that produced it.
void write_report_file(const char* variable, const std::string& path, const std::string& text);

}  // namespace mixprec
