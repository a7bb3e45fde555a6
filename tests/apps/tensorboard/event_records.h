// Reads an event file back for the tests: its TFRecords split by their length fields, each
// checked against its masked CRC-32Cs, and each parsed into the generated Event class.
#pragma once

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "apps/tensorboard/crc32c.h"
#include "apps/tensorboard/event.pb.h"

namespace tensorboard_test {

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

inline uint64_t little_endian(const std::string& bytes, size_t at, int count) {
  uint64_t value = 0;
  for (int i = count - 1; i >= 0; --i)
    value = (value << 8) | static_cast<uint8_t>(bytes[at + static_cast<size_t>(i)]);
  return value;
}

struct Records {
  std::vector<std::string> data;  // the records' payloads, in file order
  bool clean_end = false;         // the last record ended exactly at the end of the file
  bool crc_ok = true;             // every length and data CRC matched
};

// The complete records of `bytes`, stopping at the first incomplete one.
inline Records split_records(const std::string& bytes) {
  Records records;
  size_t at = 0;
  while (at + 12 <= bytes.size()) {
    const uint64_t length = little_endian(bytes, at, 8);
    const auto length_crc = static_cast<uint32_t>(little_endian(bytes, at + 8, 4));
    if (length_crc != mixprec::tensorboard::masked_crc32c(bytes.substr(at, 8))) {
      records.crc_ok = false;
      return records;
    }
    if (at + 16 + length > bytes.size()) return records;
    const std::string data = bytes.substr(at + 12, length);
    const auto data_crc = static_cast<uint32_t>(little_endian(bytes, at + 12 + length, 4));
    if (data_crc != mixprec::tensorboard::masked_crc32c(data)) {
      records.crc_ok = false;
      return records;
    }
    records.data.push_back(data);
    at += 16 + length;
  }
  records.clean_end = at == bytes.size();
  return records;
}

inline std::vector<mixprec::tensorboard::Event> parse_events(const Records& records) {
  std::vector<mixprec::tensorboard::Event> events;
  for (const std::string& data : records.data) {
    mixprec::tensorboard::Event event;
    if (!event.ParseFromString(data)) break;
    events.push_back(event);
  }
  return events;
}

}  // namespace tensorboard_test
