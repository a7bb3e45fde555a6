// Checkpoint folders. A crash at any point leaves either the previous set of complete
// checkpoints or that set plus the new one; the only debris is a hidden ".step_*" folder,
// which readers ignore.
#include "apps/checkpoint/checkpoint_dir.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <system_error>
#include <thread>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include "apps/checkpoint/atomic_file.h"
#include "apps/checkpoint/safetensors.h"
#include "core/error.h"

namespace mixprec {
namespace {

namespace fs = std::filesystem;

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kStateFile = "state.json";

std::string step_folder_name(int64_t step) { return "step_" + std::to_string(step); }

// The step of a folder named step_<digits>, or -1.
int64_t parse_step_name(const std::string& name) {
  constexpr std::string_view kPrefix = "step_";
  if (name.size() <= kPrefix.size() || name.compare(0, kPrefix.size(), kPrefix) != 0) return -1;
  const char* first = name.data() + kPrefix.size();
  const char* last = name.data() + name.size();
  if (!std::all_of(first, last, [](char c) { return c >= '0' && c <= '9'; })) return -1;
  int64_t step = -1;
  const auto [end, error] = std::from_chars(first, last, step);
  if (error != std::errc() || end != last) return -1;  // too many digits for int64
  return step;
}

bool file_exists(const fs::path& path) {
  std::error_code error;
  return fs::is_regular_file(path, error);
}

bool folder_exists(const fs::path& path) {
  std::error_code error;
  return fs::is_directory(path, error);
}

bool is_complete(const fs::path& folder) {
  return file_exists(folder / kModelFile) && file_exists(folder / kStateFile);
}

void remove_folder(const fs::path& folder, const char* why) {
  std::error_code error;
  fs::remove_all(folder, error);
  MIXPREC_CHECK(!error, why, ": cannot remove '", folder.string(), "': ", error.message());
}

void rename_folder(const fs::path& from, const fs::path& to, const char* why) {
  std::error_code error;
  fs::rename(from, to, error);
  MIXPREC_CHECK(!error, why, ": cannot rename '", from.string(), "' to '", to.string(),
                "': ", error.message());
}

// Swaps two existing paths in one rename, so that no moment exists at which either name is
// missing. Returns false, having moved nothing, when the file system cannot do that.
bool exchange_paths(const fs::path& a, const fs::path& b, const char* why) {
#ifdef RENAME_EXCHANGE
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) return true;
  const int error = errno;
  if (error == EINVAL || error == ENOSYS || error == ENOTSUP || error == EOPNOTSUPP) return false;
  MIXPREC_FAIL(why, ": cannot swap '", a.string(), "' with '", b.string(),
               "': ", std::strerror(error));
#else
  (void)a, (void)b, (void)why;
  return false;
#endif
}

// Removes a folder by first renaming it to a hidden name, so that it stops being a
// checkpoint at once; a crash during the removal leaves only hidden debris.
void retire_folder(const fs::path& folder, const std::string& pid, const char* why) {
  const std::string name = folder.filename().string();
  const fs::path hidden = folder.parent_path() / ("." + name + ".del-" + pid);
  remove_folder(hidden, why);
  rename_folder(folder, hidden, why);
  remove_folder(hidden, why);
}

// MIXPREC_TEST_SAVE_DELAY_MS (a test hook, see checkpoint_dir.h): milliseconds, 0 unset.
int64_t test_save_delay_ms() {
  const char* text = std::getenv("MIXPREC_TEST_SAVE_DELAY_MS");
  if (text == nullptr || *text == '\0') return 0;
  const char* end = text + std::strlen(text);
  int64_t ms = -1;
  const auto [last, error] = std::from_chars(text, end, ms);
  MIXPREC_CHECK(error == std::errc() && last == end && ms >= 0,
                "MIXPREC_TEST_SAVE_DELAY_MS must be a whole number of milliseconds, got '",
                text, "'");
  return ms;
}

void pause_for_test(int64_t ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

// A hidden folder that a save leaves while it works: ".step_<N>.<kind>-<pid>".
struct UnfinishedSave {
  std::string folder;  // "step_<N>", the checkpoint it belonged to
  std::string kind;    // "tmp", "old" or "del"
  long pid = 0;
};

std::optional<UnfinishedSave> parse_unfinished_name(const std::string& name) {
  if (name.size() < 2 || name[0] != '.') return std::nullopt;
  const size_t dot = name.find('.', 1);
  const size_t dash = name.find('-', dot == std::string::npos ? name.size() : dot);
  if (dot == std::string::npos || dash == std::string::npos) return std::nullopt;
  UnfinishedSave out;
  out.folder = name.substr(1, dot - 1);
  out.kind = name.substr(dot + 1, dash - dot - 1);
  if (parse_step_name(out.folder) < 0) return std::nullopt;
  if (out.kind != "tmp" && out.kind != "old" && out.kind != "del") return std::nullopt;
  const char* first = name.data() + dash + 1;
  const char* last = name.data() + name.size();
  const auto [end, error] = std::from_chars(first, last, out.pid);
  if (error != std::errc() || end != last || first == last || out.pid <= 0) return std::nullopt;
  return out;
}

// Whether another process with this id runs (its save may be in progress). Our own id's
// leftovers are stale: this process is not saving while it clears them.
bool other_process_running(long pid) {
  if (pid == static_cast<long>(::getpid())) return false;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

nlohmann::json read_state(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  MIXPREC_CHECK(in.good(), "cannot read '", file.string(), "'");
  std::ostringstream text;
  text << in.rdbuf();
  MIXPREC_CHECK(!in.bad(), "cannot read '", file.string(), "'");
  try {
    return nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {  // parse errors, and numbers beyond a double
    MIXPREC_FAIL("'", file.string(), "' is not valid JSON: ", e.what());
  }
}

}  // namespace

std::string save_checkpoint(const std::string& checkpoints_dir, int64_t step,
                            const CheckpointData& data, int64_t keep) {
  MIXPREC_CHECK(step >= 0, "save_checkpoint: step must not be negative, got ", step);
  const fs::path dir(checkpoints_dir);
  const std::string name = step_folder_name(step);
  const std::string why = "saving checkpoint '" + (dir / name).string() + "'";
  const int64_t delay_ms = test_save_delay_ms();
  std::error_code error;
  const bool created = fs::create_directories(dir, error);
  MIXPREC_CHECK(!error, why, ": cannot create folder '", dir.string(), "': ", error.message());
  // A new checkpoints folder must itself survive a crash for the checkpoint inside to.
  if (created) fsync_directory(dir.has_parent_path() ? dir.parent_path().string() : ".");

  std::string state_text;
  try {
    state_text = data.state.dump(1, ' ', false, nlohmann::json::error_handler_t::strict);
  } catch (const nlohmann::json::exception& e) {
    MIXPREC_FAIL(why, ": state cannot be written as JSON: ", e.what());
  }
  state_text += '\n';

  const std::string pid = std::to_string(::getpid());
  const fs::path temp = dir / ("." + name + ".tmp-" + pid);
  const fs::path final_path = dir / name;
  // A leftover from an earlier process with our pid (pids are reused) is ours to replace.
  remove_folder(temp, why.c_str());
  fs::create_directory(temp, error);
  MIXPREC_CHECK(!error, why, ": cannot create folder '", temp.string(), "': ",
                error.message());
  bool swapped = false;  // step_<N> existed and now lies under the temporary name
  fs::path aside;        // without RENAME_EXCHANGE: the step_<N> being replaced, moved aside
  try {
    // Both writes fsync their file and the temporary folder.
    write_safetensors((temp / kModelFile).string(), data.model);
    pause_for_test(delay_ms);
    write_file_atomic((temp / kStateFile).string(), state_text.data(), state_text.size());
    pause_for_test(delay_ms);

    const bool exists = fs::exists(final_path, error) || fs::is_symlink(final_path, error);
    swapped = exists && exchange_paths(temp, final_path, why.c_str());
    if (exists && !swapped) {
      // Two renames: a crash between them leaves step_<N> missing and the previous one
      // under ".old", which remove_unfinished_saves puts back.
      aside = dir / ("." + name + ".old-" + pid);
      remove_folder(aside, why.c_str());
      rename_folder(final_path, aside, why.c_str());
    }
    if (!swapped) {
      try {
        rename_folder(temp, final_path, why.c_str());
      } catch (const Error&) {
        // Put the previous checkpoint back: a failed save must not lose it.
        if (!aside.empty()) fs::rename(aside, final_path, error);
        throw;
      }
    }
    fsync_directory(dir.string());
  } catch (const Error&) {
    // After a swap the temporary name holds the replaced checkpoint, which goes anyway.
    fs::remove_all(temp, error);
    throw;
  }
  pause_for_test(delay_ms);
  if (swapped) remove_folder(temp, why.c_str());
  if (!aside.empty()) remove_folder(aside, why.c_str());

  if (keep > 0) {
    const auto complete = list_checkpoints(checkpoints_dir);
    std::set<int64_t> kept;
    for (auto it = complete.rbegin(); it != complete.rend() && kept.size() < size_t(keep); ++it) {
      kept.insert(it->first);
    }
    for (const auto& [other_step, path] : complete) {
      if (other_step == step || kept.count(other_step)) continue;
      retire_folder(path, pid,
                    (why + " (removing checkpoints beyond keep=" + std::to_string(keep) +
                     ", after the new one was written)")
                        .c_str());
    }
  }
  return final_path.string();
}

std::string checkpoint_folder(const std::string& checkpoints_dir, int64_t step) {
  return (fs::path(checkpoints_dir) / step_folder_name(step)).string();
}

int remove_unfinished_saves(const std::string& checkpoints_dir) {
  const fs::path dir(checkpoints_dir);
  if (!folder_exists(dir)) return 0;
  std::vector<std::pair<fs::path, UnfinishedSave>> found;
  std::error_code error;
  fs::directory_iterator it(dir, error);
  MIXPREC_CHECK(!error, "cannot list checkpoints in '", checkpoints_dir, "': ", error.message());
  for (; it != fs::directory_iterator(); it.increment(error)) {
    MIXPREC_CHECK(!error, "cannot list checkpoints in '", checkpoints_dir, "': ",
                  error.message());
    std::optional<UnfinishedSave> save = parse_unfinished_name(it->path().filename().string());
    if (save && !other_process_running(save->pid)) found.emplace_back(it->path(), *save);
  }
  const std::string why = "clearing unfinished saves in '" + checkpoints_dir + "'";
  int cleared = 0;
  for (const auto& [path, save] : found) {
    const fs::path final_path = dir / save.folder;
    // A folder moved aside whose replacement never arrived is the only copy of its step.
    if (save.kind == "old" && folder_exists(path) && is_complete(path) &&
        !fs::exists(final_path, error) && !fs::is_symlink(final_path, error)) {
      rename_folder(path, final_path, why.c_str());
      fsync_directory(dir.string());
    } else {
      remove_folder(path, why.c_str());
    }
    ++cleared;
  }
  return cleared;
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(
    const std::string& checkpoints_dir) {
  const fs::path dir(checkpoints_dir);
  std::error_code error;
  if (!fs::exists(dir, error)) return {};
  MIXPREC_CHECK(folder_exists(dir), "cannot list checkpoints: '", checkpoints_dir,
                "' is not a folder");
  // step -> folder name; step_7 and step_007 are one step, and the name that save_checkpoint
  // writes wins, so that the choice does not depend on the order of the listing.
  std::map<int64_t, std::string> found;
  fs::directory_iterator it(dir, error);
  MIXPREC_CHECK(!error, "cannot list checkpoints in '", checkpoints_dir, "': ", error.message());
  for (; it != fs::directory_iterator(); it.increment(error)) {
    MIXPREC_CHECK(!error, "cannot list checkpoints in '", checkpoints_dir, "': ",
                  error.message());
    const std::string name = it->path().filename().string();
    const int64_t step = parse_step_name(name);
    if (step < 0 || !folder_exists(it->path()) || !is_complete(it->path())) continue;
    auto [slot, inserted] = found.emplace(step, name);
    if (!inserted && (name == step_folder_name(step) ||
                      (slot->second != step_folder_name(step) && name < slot->second))) {
      slot->second = name;
    }
  }
  MIXPREC_CHECK(!error, "cannot list checkpoints in '", checkpoints_dir, "': ", error.message());
  std::vector<std::pair<int64_t, std::string>> out;
  out.reserve(found.size());
  for (const auto& [step, name] : found) out.emplace_back(step, (dir / name).string());
  return out;
}

LoadedCheckpoint load_checkpoint(const std::string& path) {
  const fs::path given(path);
  fs::path folder;
  if (folder_exists(given) && file_exists(given / kModelFile)) {
    folder = given;
  } else {
    // A run folder (checkpoints/ inside) or a checkpoints folder itself.
    const fs::path dir = folder_exists(given / "checkpoints") ? given / "checkpoints" : given;
    if (folder_exists(dir)) {
      const auto complete = list_checkpoints(dir.string());
      if (!complete.empty()) folder = complete.back().second;
    }
  }
  std::error_code error;
  MIXPREC_CHECK(!folder.empty(), "no checkpoint found in '", path, "'",
                folder_exists(given)             ? ""
                : fs::exists(given, error) ? " (not a folder)"
                                           : " (no such folder)");

  const fs::path state_file = folder / kStateFile;
  MIXPREC_CHECK(file_exists(state_file), "cannot load checkpoint '", folder.string(),
                "': '", state_file.string(), "' is missing");
  LoadedCheckpoint out;
  out.path = folder.string();
  out.model = read_safetensors((folder / kModelFile).string()).tensors;
  out.state = read_state(state_file);
  return out;
}

}  // namespace mixprec
