// Files that appear complete or not at all: the bytes go to "<path>.tmp-<pid>" in the same
// folder, which is fsynced, renamed over <path>, and the folder fsynced, so that neither a
// reader nor a crash (power loss included) ever sees a half-written file.
#pragma once

#include <cstddef>
#include <string>

namespace mixprec {

class AtomicFile {
 public:
  // Creates (or truncates) the temporary file. Throws mixprec::Error naming the path and the
  // system's reason.
  explicit AtomicFile(std::string path);
  // Without commit(), closes and removes the temporary file; <path> is left as it was.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Appends `size` bytes. On failure removes the temporary file and throws naming the path.
  void write(const void* data, size_t size);
  // fsync, close, rename over <path>, fsync the folder. Call once; nothing may be written
  // after it. On failure removes the temporary file and throws naming the path.
  void commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }

 private:
  [[noreturn]] void fail(const char* action, int error);
  void discard() noexcept;

  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  bool committed_ = false;
};

// Writes `size` bytes to `path` through an AtomicFile.
void write_file_atomic(const std::string& path, const void* data, size_t size);

// fsyncs a folder, so that the renames and creations in it survive a crash. Throws
// mixprec::Error naming the folder.
void fsync_directory(const std::string& path);

}  // namespace mixprec
