// TFRecord framing, the container of TensorBoard's event files. Each record is
//   uint64 length (little-endian) | uint32 masked_crc32c(length bytes) |
//   data | uint32 masked_crc32c(data)
// so a reader can tell a complete record from one cut short by a crash: it stops at the
// first record whose bytes or checksums are incomplete, and keeps every record before it.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace mixprec::tensorboard {

// `data` framed as one record (16 + data.size() bytes).
std::string tfrecord_frame(std::string_view data);

// Appends records to a file. Each append() ends with a flush to the operating system, so once
// it returns the record is in the file for any reader (a live TensorBoard), and a process
// killed at any moment leaves at most the record it was appending cut short, which readers
// stop at. No fsync: a power loss may lose the last records.
class TFRecordWriter {
 public:
  // Creates `path` (it must not exist, so an earlier file is never written over). Throws
  // mixprec::Error naming the path and the reason.
  explicit TFRecordWriter(std::string path);
  ~TFRecordWriter();
  TFRecordWriter(const TFRecordWriter&) = delete;
  TFRecordWriter& operator=(const TFRecordWriter&) = delete;

  // Throws mixprec::Error naming the path when the write or the flush fails (disk full).
  void append(std::string_view data);

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace mixprec::tensorboard
