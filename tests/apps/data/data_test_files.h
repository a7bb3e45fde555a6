// Files for the data tests: a temporary folder, IDX and gzip writers, and the real data sets
// found in the data folders (tests/repo_data.h).
#pragma once

#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/repo_data.h"

namespace data_test {

// A fresh folder under the system temporary folder, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("mixprec_data_test_" + std::to_string(::getpid()) + "_" +
             std::to_string(counter.fetch_add(1)));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

inline void write_text(const std::string& path, const std::string& text) {
  write_bytes(path, std::vector<uint8_t>(text.begin(), text.end()));
}

// `bytes` as one gzip member, in memory.
inline std::vector<uint8_t> gzip_bytes(const std::vector<uint8_t>& bytes) {
  z_stream zs{};
  if (deflateInit2(&zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    throw std::runtime_error("deflateInit2 failed");
  }
  std::vector<uint8_t> out(deflateBound(&zs, static_cast<uLong>(bytes.size())) + 64);
  zs.next_in = const_cast<Bytef*>(bytes.data());
  zs.avail_in = static_cast<uInt>(bytes.size());
  zs.next_out = out.data();
  zs.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&zs, Z_FINISH);
  deflateEnd(&zs);
  if (rc != Z_STREAM_END) throw std::runtime_error("deflate failed");
  out.resize(zs.total_out);
  return out;
}

inline void append_u32_big_endian(std::vector<uint8_t>& out, uint32_t value) {
  out.push_back(static_cast<uint8_t>(value >> 24));
  out.push_back(static_cast<uint8_t>(value >> 16));
  out.push_back(static_cast<uint8_t>(value >> 8));
  out.push_back(static_cast<uint8_t>(value));
}

// An IDX image file as the format describes it: magic 0x00000803, count, rows, cols
// (big-endian), then the pixels.
inline std::vector<uint8_t> idx_images(uint32_t count, uint32_t rows, uint32_t cols,
                                       const std::vector<uint8_t>& pixels) {
  std::vector<uint8_t> out;
  append_u32_big_endian(out, 0x00000803);
  append_u32_big_endian(out, count);
  append_u32_big_endian(out, rows);
  append_u32_big_endian(out, cols);
  out.insert(out.end(), pixels.begin(), pixels.end());
  return out;
}

// An IDX label file: magic 0x00000801, count, then the labels.
inline std::vector<uint8_t> idx_labels(const std::vector<uint8_t>& labels) {
  std::vector<uint8_t> out;
  append_u32_big_endian(out, 0x00000801);
  append_u32_big_endian(out, static_cast<uint32_t>(labels.size()));
  out.insert(out.end(), labels.begin(), labels.end());
  return out;
}

// Full path of `relative` in the data folders (tests/repo_data.h's find_data), or "" when
// no folder has that file.
inline std::string shared_data_file(const std::string& relative) {
  const std::filesystem::path path = mixprec_test::find_data(relative);
  std::error_code error;
  return !path.empty() && std::filesystem::is_regular_file(path, error) ? path.string()
                                                                        : std::string();
}

}  // namespace data_test
