// gnuplot runs as a child process with its working folder set to the chart's folder, so the
// scripts stay relocatable (they name their data files without a path) and can be rerun by
// hand exactly as written.
#include "apps/plot/gnuplot.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "apps/checkpoint/atomic_file.h"
#include "core/error.h"

namespace mixprec {

namespace fs = std::filesystem;

namespace {

// Runs `gnuplot <args...>` in `folder` with stdout discarded; returns the exit status (127
// when it cannot be started) and the first line of its stderr. fork/exec rather than a shell,
// so folder names need no quoting.
int run_gnuplot(const std::string& folder, const std::vector<std::string>& args,
                std::string& first_error) {
  const std::string err_path = (fs::path(folder) / ".gnuplot-stderr").string();
  const pid_t pid = fork();
  if (pid < 0) return 127;
  if (pid == 0) {
    const int null_fd = open("/dev/null", O_WRONLY);
    const int err_fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (null_fd < 0 || err_fd < 0 || chdir(folder.c_str()) != 0) _exit(127);
    dup2(null_fd, STDOUT_FILENO);
    dup2(err_fd, STDERR_FILENO);
    signal(SIGPIPE, SIG_DFL);  // mixprec ignores it (main.cpp); an ignored signal survives exec
    std::vector<char*> argv{const_cast<char*>("gnuplot")};
    for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    execvp("gnuplot", argv.data());
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  std::ifstream err(err_path);
  std::getline(err, first_error);
  std::error_code ignored;
  fs::remove(err_path, ignored);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

bool has_pngcairo() {
  static const bool cached = [] {
    std::string ignored;
    const std::string tmp = fs::temp_directory_path().string();
    return run_gnuplot(tmp, {"-e", "set terminal pngcairo"}, ignored) == 0;
  }();
  return cached;
}

}  // namespace

bool gnuplot_available() {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return false;
  std::stringstream dirs(path);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (dir.empty()) continue;
    const fs::path candidate = fs::path(dir) / "gnuplot";
    if (access(candidate.c_str(), X_OK) == 0) return true;
  }
  return false;
}

std::string gnuplot_quote(const std::string& text) {
  std::string quoted;
  for (const char c : text) {
    quoted += c;
    if (c == '\'') quoted += '\'';
  }
  return quoted;
}

ChartResult render_chart(const std::string& folder, const std::string& stem,
                         const std::string& script, int width, int height) {
  MIXPREC_CHECK(width > 0 && height > 0, "chart size must be positive, got ", width, "x",
                height);
  ChartResult result;
  result.script_path = (fs::path(folder) / (stem + ".gp")).string();
  result.png_path = (fs::path(folder) / (stem + ".png")).string();
  const bool available = gnuplot_available();
  const std::string terminal = available && has_pngcairo() ? "pngcairo" : "png";
  const std::string text = "set terminal " + terminal + " size " + std::to_string(width) +
                           "," + std::to_string(height) + "\nset output '" +
                           gnuplot_quote(stem + ".png") + "'\n" + script;
  write_file_atomic(result.script_path, text.data(), text.size());
  const std::string rerun = "cd " + folder + " && gnuplot " + stem + ".gp";
  if (!available) {
    result.message = "gnuplot is not installed: wrote " + result.script_path +
                     " and its data; render with `" + rerun + "` (Debian: gnuplot-nox)";
    return result;
  }
  std::string first_error;
  const int status = run_gnuplot(folder, {stem + ".gp"}, first_error);
  std::error_code ignored;
  result.rendered = status == 0 && fs::exists(result.png_path, ignored);
  result.message = result.rendered ? "wrote " + result.png_path
                                   : "gnuplot failed on " + result.script_path + " (" +
                                         (first_error.empty() ? "exit " + std::to_string(status)
                                                              : first_error) +
                                         "); rerun with `" + rerun + "`";
  return result;
}

}  // namespace mixprec
