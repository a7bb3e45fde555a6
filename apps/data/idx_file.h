// IDX files (the MNIST / Fashion-MNIST layout, http://yann.lecun.com/exdb/mnist/), raw or
// gzip-compressed (detected from the first two bytes, not from the name).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace mixprec {

struct IdxImages {
  int64_t count = 0, rows = 0, cols = 0;
  std::vector<uint8_t> pixels;  // count * rows * cols, row-major
};

// Magic 0x00000803 (unsigned bytes, 3 dims). Throws mixprec::Error naming the path and the
// problem: missing or unreadable file, corrupt gzip stream, wrong magic (with the value found),
// zero or absurd extents, a file shorter than its header says ("truncated: expected N bytes
// of pixels, found M"), trailing bytes.
IdxImages read_idx_images(const std::string& path);
// Magic 0x00000801 (unsigned bytes, 1 dim), same errors.
std::vector<uint8_t> read_idx_labels(const std::string& path);

// The same from a file's whole content in memory (raw or gzip); `name` stands for the path in
// messages. The path versions read the file and call these.
IdxImages read_idx_images(std::span<const uint8_t> bytes, const std::string& name);
std::vector<uint8_t> read_idx_labels(std::span<const uint8_t> bytes, const std::string& name);

}  // namespace mixprec
