#include "apps/tensorboard/tfrecord.h"

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "apps/tensorboard/crc32c.h"
#include "core/error.h"

namespace mixprec::tensorboard {

namespace {

void append_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFFu));
}

}  // namespace

std::string tfrecord_frame(std::string_view data) {
  std::string record;
  record.reserve(16 + data.size());
  append_le(record, data.size(), 8);
  append_le(record, masked_crc32c(std::string_view(record.data(), 8)), 4);
  record.append(data);
  append_le(record, masked_crc32c(data), 4);
  return record;
}

TFRecordWriter::TFRecordWriter(std::string path) : path_(std::move(path)) {
  // "x": fail rather than truncate a file that is already there.
  file_ = std::fopen(path_.c_str(), "wbx");
  MIXPREC_CHECK(file_ != nullptr, "cannot create '", path_, "': ", std::strerror(errno));
}

TFRecordWriter::~TFRecordWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void TFRecordWriter::append(std::string_view data) {
  const std::string record = tfrecord_frame(data);
  const bool written = std::fwrite(record.data(), 1, record.size(), file_) == record.size();
  MIXPREC_CHECK(written && std::fflush(file_) == 0, "writing '", path_,
                "' failed: ", std::strerror(errno));
}

}  // namespace mixprec::tensorboard
