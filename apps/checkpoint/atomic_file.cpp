// POSIX file descriptors rather than streams: fsync needs the descriptor, and every failing
// call has an errno that the message can carry.
#include "apps/checkpoint/atomic_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

namespace mixprec {
namespace {

std::string parent_folder(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

}  // namespace

AtomicFile::AtomicFile(std::string path)
    : path_(std::move(path)), temp_path_(path_ + ".tmp-" + std::to_string(::getpid())) {
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const int error = errno;
    MIXPREC_FAIL("cannot write '", path_, "': creating '", temp_path_,
                 "' failed: ", std::strerror(error));
  }
}

AtomicFile::~AtomicFile() {
  if (!committed_) discard();
}

void AtomicFile::discard() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(temp_path_.c_str());
}

void AtomicFile::fail(const char* action, int error) {
  discard();
  committed_ = true;  // nothing left to clean up
  MIXPREC_FAIL("cannot write '", path_, "': ", action, " '", temp_path_,
               "' failed: ", std::strerror(error));
}

void AtomicFile::write(const void* data, size_t size) {
  MIXPREC_CHECK(fd_ >= 0 && !committed_, "cannot write '", path_,
                "': the file was already committed or abandoned");
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t written = ::write(fd_, bytes, size);
    if (written < 0) {
      if (errno == EINTR) continue;
      fail("writing", errno);
    }
    bytes += written;
    size -= static_cast<size_t>(written);
  }
}

void AtomicFile::commit() {
  MIXPREC_CHECK(fd_ >= 0 && !committed_, "cannot write '", path_,
                "': the file was already committed or abandoned");
  if (::fsync(fd_) != 0) fail("fsync of", errno);
  const int fd = std::exchange(fd_, -1);
  // close can report a deferred write error (NFS): the data would not be there.
  if (::close(fd) != 0) fail("closing", errno);
  if (std::rename(temp_path_.c_str(), path_.c_str()) != 0) fail("renaming", errno);
  committed_ = true;
  fsync_directory(parent_folder(path_));
}

void write_file_atomic(const std::string& path, const void* data, size_t size) {
  AtomicFile file(path);
  file.write(data, size);
  file.commit();
}

void fsync_directory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    MIXPREC_FAIL("cannot fsync folder '", path, "': ", std::strerror(error));
  }
  const int result = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  // Some file systems cannot fsync a folder at all (EINVAL); that is no reason to fail a save.
  MIXPREC_CHECK(result == 0 || error == EINVAL, "cannot fsync folder '", path,
                "': ", std::strerror(error));
}

}  // namespace mixprec
