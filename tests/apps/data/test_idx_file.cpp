// IDX reading: hand-built files (raw and gzip) for the format and every error, and the real
// MNIST test set checked against well-known values and against zlib's own gzread.
#include <catch2/catch.hpp>

#include <zlib.h>

#include <array>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "apps/data/idx_file.h"
#include "core/error.h"
#include "data_test_files.h"

using namespace mixprec;
using data_test::TempDir;

namespace {

// Three 2x4 images whose pixels are 10 * image + position, so every byte says where it is.
std::vector<uint8_t> sample_pixels() {
  std::vector<uint8_t> pixels;
  for (int image = 0; image < 3; ++image) {
    for (int k = 0; k < 8; ++k) pixels.push_back(static_cast<uint8_t>(10 * image + k));
  }
  return pixels;
}

// The whole decompressed contents of a gzip file, read with zlib's gzread.
std::vector<uint8_t> gunzip_file(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  REQUIRE(file != nullptr);
  std::vector<uint8_t> out;
  std::array<uint8_t, 1 << 16> chunk{};
  int got;
  while ((got = gzread(file, chunk.data(), static_cast<unsigned>(chunk.size()))) > 0) {
    out.insert(out.end(), chunk.begin(), chunk.begin() + got);
  }
  REQUIRE(got == 0);
  gzclose(file);
  return out;
}

}  // namespace

TEST_CASE("read_idx_images reads the header and pixels of a raw IDX file", "[data][idx]") {
  TempDir dir;
  const std::string path = dir.file("images-idx3-ubyte");
  data_test::write_bytes(path, data_test::idx_images(3, 2, 4, sample_pixels()));
  const IdxImages images = read_idx_images(path);
  CHECK(images.count == 3);
  CHECK(images.rows == 2);
  CHECK(images.cols == 4);
  REQUIRE(images.pixels.size() == 24);
  // Image 2, row 1, column 3 is byte 2 * 8 + 1 * 4 + 3 = 23, written as 10 * 2 + 7.
  CHECK(images.pixels[23] == 27);
  CHECK(images.pixels == sample_pixels());
}

TEST_CASE("read_idx_labels reads a raw IDX label file", "[data][idx]") {
  TempDir dir;
  const std::string path = dir.file("labels-idx1-ubyte");
  const std::vector<uint8_t> labels = {7, 2, 1, 0, 4, 255};
  data_test::write_bytes(path, data_test::idx_labels(labels));
  CHECK(read_idx_labels(path) == labels);
}

TEST_CASE("IDX files read the same raw, gzip-compressed and as several gzip members",
          "[data][idx]") {
  TempDir dir;
  const std::vector<uint8_t> raw_images = data_test::idx_images(3, 2, 4, sample_pixels());
  const std::vector<uint8_t> raw_labels = data_test::idx_labels({3, 1, 4});
  // The name does not decide: a gzip file without .gz and a raw file with .gz.
  data_test::write_bytes(dir.file("images.gz"), raw_images);
  data_test::write_bytes(dir.file("images"), data_test::gzip_bytes(raw_images));
  data_test::write_bytes(dir.file("labels.gz"), raw_labels);
  data_test::write_bytes(dir.file("labels"), data_test::gzip_bytes(raw_labels));
  // `cat a.gz b.gz`: the header in one member, the pixels in another.
  std::vector<uint8_t> two_members = data_test::gzip_bytes(
      std::vector<uint8_t>(raw_images.begin(), raw_images.begin() + 16));
  const std::vector<uint8_t> second =
      data_test::gzip_bytes(std::vector<uint8_t>(raw_images.begin() + 16, raw_images.end()));
  two_members.insert(two_members.end(), second.begin(), second.end());
  data_test::write_bytes(dir.file("images-two-members"), two_members);

  for (const char* name : {"images.gz", "images", "images-two-members"}) {
    INFO(name);
    const IdxImages images = read_idx_images(dir.file(name));
    CHECK(images.count == 3);
    CHECK(images.rows == 2);
    CHECK(images.cols == 4);
    CHECK(images.pixels == sample_pixels());
  }
  const std::vector<uint8_t> expected = {3, 1, 4};
  CHECK(read_idx_labels(dir.file("labels.gz")) == expected);
  CHECK(read_idx_labels(dir.file("labels")) == expected);
}

TEST_CASE("IDX bytes in memory read like the file they came from", "[data][idx]") {
  const std::vector<uint8_t> raw_images = data_test::idx_images(3, 2, 4, sample_pixels());
  for (const std::vector<uint8_t>& bytes : {raw_images, data_test::gzip_bytes(raw_images)}) {
    const IdxImages images = read_idx_images(bytes, "in memory");
    CHECK(images.count == 3);
    CHECK(images.rows == 2);
    CHECK(images.cols == 4);
    CHECK(images.pixels == sample_pixels());
  }
  const std::vector<uint8_t> labels = {7, 2, 1};
  CHECK(read_idx_labels(data_test::gzip_bytes(data_test::idx_labels(labels)), "in memory") ==
        labels);
  // Errors name what the caller gave in place of a path.
  const std::vector<uint8_t> cut(raw_images.begin(), raw_images.end() - 4);
  CHECK_THROWS_WITH(read_idx_images(cut, "in memory"),
                    Catch::Contains("IDX file 'in memory'") &&
                        Catch::Contains("truncated: expected 24 bytes of pixels, found 20"));
  CHECK_THROWS_WITH(read_idx_labels(std::vector<uint8_t>{}, "nothing"),
                    Catch::Contains("'nothing'") &&
                        Catch::Contains("truncated header: expected 8 bytes, found 0"));
}

// A gzip file that announces far more pixels than it holds fails as truncated; the reader
// sizes its buffer by what the compressed bytes left can inflate to, not by the header.
TEST_CASE("IDX: a gzip header announcing a huge image count fails as truncated",
          "[data][idx]") {
  const std::vector<uint8_t> bytes =
      data_test::gzip_bytes(data_test::idx_images(0xffffffffu, 65536, 65536, {1, 2, 3}));
  CHECK_THROWS_WITH(read_idx_images(bytes, "huge.gz"),
                    Catch::Contains("'huge.gz'") &&
                        Catch::Contains("expected 18446744069414584320 bytes of pixels, found 3"));
}

TEST_CASE("IDX errors name the file and the problem", "[data][idx]") {
  TempDir dir;
  const std::vector<uint8_t> good = data_test::idx_images(3, 2, 4, sample_pixels());

  SECTION("missing file") {
    const std::string path = dir.file("absent-idx3-ubyte");
    CHECK_THROWS_WITH(read_idx_images(path), Catch::Contains(path) &&
                                                 Catch::Contains("No such file or directory"));
    CHECK_THROWS_AS(read_idx_labels(path), Error);
  }
  SECTION("a folder instead of a file") {
    CHECK_THROWS_WITH(read_idx_images(dir.path()),
                      Catch::Contains(dir.path()) && Catch::Contains("Is a directory"));
  }
  SECTION("wrong magic: a label file read as images, and the reverse") {
    const std::string labels = dir.file("labels");
    data_test::write_bytes(labels, data_test::idx_labels({1, 2, 3}));
    CHECK_THROWS_WITH(read_idx_images(labels),
                      Catch::Contains(labels) && Catch::Contains("wrong magic 0x00000801") &&
                          Catch::Contains("expected 0x00000803"));
    const std::string images = dir.file("images");
    data_test::write_bytes(images, good);
    CHECK_THROWS_WITH(read_idx_labels(images),
                      Catch::Contains(images) && Catch::Contains("wrong magic 0x00000803"));
    const std::string text = dir.file("text");
    data_test::write_text(text, "hello, world, not IDX");
    // "hell" read big-endian.
    CHECK_THROWS_WITH(read_idx_images(text), Catch::Contains("wrong magic 0x68656c6c"));
  }
  SECTION("truncated header") {
    const std::string path = dir.file("short-header");
    data_test::write_bytes(path, std::vector<uint8_t>(good.begin(), good.begin() + 10));
    CHECK_THROWS_WITH(read_idx_images(path),
                      Catch::Contains(path) &&
                          Catch::Contains("truncated header: expected 16 bytes, found 10"));
    const std::string labels = dir.file("short-label-header");
    data_test::write_bytes(labels, {0, 0, 8, 1, 0, 0});
    CHECK_THROWS_WITH(read_idx_labels(labels),
                      Catch::Contains("truncated header: expected 8 bytes, found 6"));
    const std::string empty = dir.file("empty");
    data_test::write_bytes(empty, {});
    CHECK_THROWS_WITH(read_idx_images(empty),
                      Catch::Contains("truncated header: expected 16 bytes, found 0"));
  }
  SECTION("truncated pixels, raw and gzip") {
    // 3 * 2 * 4 = 24 pixel bytes announced, 20 present.
    const std::vector<uint8_t> cut(good.begin(), good.end() - 4);
    const std::string raw = dir.file("cut"), gz = dir.file("cut.gz");
    data_test::write_bytes(raw, cut);
    data_test::write_bytes(gz, data_test::gzip_bytes(cut));
    for (const std::string& path : {raw, gz}) {
      CHECK_THROWS_WITH(read_idx_images(path),
                        Catch::Contains(path) &&
                            Catch::Contains("truncated: expected 24 bytes of pixels, found 20"));
    }
    const std::string labels = dir.file("cut-labels");
    std::vector<uint8_t> label_bytes = data_test::idx_labels({1, 2, 3, 4, 5});
    label_bytes.pop_back();
    data_test::write_bytes(labels, label_bytes);
    CHECK_THROWS_WITH(read_idx_labels(labels),
                      Catch::Contains("truncated: expected 5 bytes of labels, found 4"));
  }
  SECTION("a header announcing a huge image count fails as truncated, without allocating it") {
    const std::string path = dir.file("huge");
    data_test::write_bytes(path, data_test::idx_images(0xffffffffu, 65536, 65536, {1, 2, 3}));
    // 4294967295 * 65536 * 65536 bytes.
    CHECK_THROWS_WITH(read_idx_images(path),
                      Catch::Contains("expected 18446744069414584320 bytes of pixels, found 3"));
  }
  SECTION("trailing bytes") {
    std::vector<uint8_t> longer = good;
    longer.insert(longer.end(), {9, 9, 9});
    const std::string raw = dir.file("long"), gz = dir.file("long.gz");
    data_test::write_bytes(raw, longer);
    data_test::write_bytes(gz, data_test::gzip_bytes(longer));
    for (const std::string& path : {raw, gz}) {
      CHECK_THROWS_WITH(read_idx_images(path),
                        Catch::Contains(path) && Catch::Contains("3 trailing bytes"));
    }
  }
  SECTION("zero or absurd extents") {
    const std::string path = dir.file("extents");
    data_test::write_bytes(path, data_test::idx_images(0, 28, 28, {}));
    CHECK_THROWS_WITH(read_idx_images(path), Catch::Contains(path) && Catch::Contains("zero"));
    data_test::write_bytes(path, data_test::idx_images(1, 0, 28, {}));
    CHECK_THROWS_WITH(read_idx_images(path), Catch::Contains("image size 0x28 is invalid"));
    data_test::write_bytes(path, data_test::idx_images(1, 28, 70000, {}));
    CHECK_THROWS_WITH(read_idx_images(path), Catch::Contains("image size 28x70000 is invalid"));
    data_test::write_bytes(path, data_test::idx_labels({}));
    CHECK_THROWS_WITH(read_idx_labels(path), Catch::Contains("zero labels"));
  }
  SECTION("corrupt gzip: a valid gzip header, then garbage") {
    const std::string path = dir.file("corrupt.gz");
    // Magic, deflate, no flags, mtime 0, xfl 0, OS unix; then bytes that are no deflate data
    // (0xff starts a block of the reserved type 3).
    std::vector<uint8_t> bytes = {0x1f, 0x8b, 0x08, 0x00, 0, 0, 0, 0, 0x00, 0x03};
    for (int i = 0; i < 64; ++i) bytes.push_back(0xff);
    data_test::write_bytes(path, bytes);
    CHECK_THROWS_WITH(read_idx_images(path),
                      Catch::Contains(path) && Catch::Contains("corrupt gzip stream"));
    CHECK_THROWS_WITH(read_idx_labels(path), Catch::Contains("corrupt gzip stream"));
  }
  SECTION("gzip with a wrong CRC-32") {
    std::vector<uint8_t> bytes = data_test::gzip_bytes(good);
    // The trailer is CRC-32 then length, 4 bytes each.
    bytes[bytes.size() - 8] ^= 0x01;
    const std::string path = dir.file("bad-crc.gz");
    data_test::write_bytes(path, bytes);
    CHECK_THROWS_WITH(read_idx_images(path), Catch::Contains("corrupt gzip stream"));
  }
  SECTION("gzip cut short") {
    std::vector<uint8_t> bytes = data_test::gzip_bytes(good);
    bytes.resize(bytes.size() / 2);
    const std::string path = dir.file("half.gz");
    data_test::write_bytes(path, bytes);
    CHECK_THROWS_WITH(read_idx_images(path),
                      Catch::Contains(path) && Catch::Contains("gzip stream ends early"));
  }
  SECTION("data after the gzip stream that is not another member") {
    std::vector<uint8_t> bytes = data_test::gzip_bytes(good);
    bytes.insert(bytes.end(), {'j', 'u', 'n', 'k'});
    const std::string path = dir.file("junk.gz");
    data_test::write_bytes(path, bytes);
    CHECK_THROWS_WITH(read_idx_images(path),
                      Catch::Contains("4 bytes after the end of the gzip stream"));
  }
}

TEST_CASE("MNIST test set: known labels, counts and pixels", "[data][idx][mnist]") {
  const std::string images_path = data_test::shared_data_file("mnist/t10k-images-idx3-ubyte.gz");
  const std::string labels_path = data_test::shared_data_file("mnist/t10k-labels-idx1-ubyte.gz");
  if (images_path.empty() || labels_path.empty()) {
    WARN("skipped: MNIST t10k files not found in the data folders");
    return;
  }
  const std::vector<uint8_t> labels = read_idx_labels(labels_path);
  REQUIRE(labels.size() == 10000);
  // The first three test digits are 7, 2, 1.
  CHECK(labels[0] == 7);
  CHECK(labels[1] == 2);
  CHECK(labels[2] == 1);
  // The published class counts of the MNIST test set.
  const std::array<int, 10> published = {980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009};
  std::array<int, 10> counts{};
  for (uint8_t label : labels) {
    REQUIRE(label < 10);
    ++counts[label];
  }
  CHECK(counts == published);

  const IdxImages images = read_idx_images(images_path);
  CHECK(images.count == 10000);
  CHECK(images.rows == 28);
  CHECK(images.cols == 28);
  REQUIRE(images.pixels.size() == 10000u * 28 * 28);
  const long first_sum =
      std::accumulate(images.pixels.begin(), images.pixels.begin() + 784, 0L);
  CHECK(first_sum > 0);
  // The same bytes through zlib's gzread, after the 16-byte header.
  const std::vector<uint8_t> whole = gunzip_file(images_path);
  REQUIRE(whole.size() == 16 + images.pixels.size());
  CHECK(std::equal(images.pixels.begin(), images.pixels.end(), whole.begin() + 16));
}
