// IDX reading. The file is read whole (a compressed MNIST set is a few MB), then served as a
// byte stream: copied for a raw file, inflated on demand for a gzip one. Reading on demand
// means that nothing is allocated from the header's extents before the data has shown up, so
// a corrupt header that announces terabytes fails as "truncated" instead of exhausting memory.
#include "apps/data/idx_file.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <iomanip>
#include <sstream>

#include "core/error.h"

namespace mixprec {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;
constexpr uint32_t kLabelsMagic = 0x00000801;
// Largest row or column count taken seriously: real IDX images are 28x28; anything past this
// is a corrupt header, not a picture.
constexpr uint32_t kMaxSide = 1u << 16;

std::string hex32(uint32_t value) {
  std::ostringstream out;
  out << "0x" << std::hex << std::setw(8) << std::setfill('0') << value;
  return out.str();
}

uint32_t big_endian_u32(const uint8_t* bytes) {
  return (static_cast<uint32_t>(bytes[0]) << 24) | (static_cast<uint32_t>(bytes[1]) << 16) |
         (static_cast<uint32_t>(bytes[2]) << 8) | static_cast<uint32_t>(bytes[3]);
}

std::vector<uint8_t> read_whole_file(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    MIXPREC_FAIL("cannot open IDX file '", path, "': ", std::strerror(errno));
  }
  std::vector<uint8_t> bytes;
  uint8_t chunk[1 << 16];
  while (true) {
    const size_t got = std::fread(chunk, 1, sizeof(chunk), file);
    bytes.insert(bytes.end(), chunk, chunk + got);
    if (got < sizeof(chunk)) break;
  }
  // fopen succeeds on a directory; the read is what fails, with EISDIR.
  const bool failed = std::ferror(file) != 0;
  const int error = errno;
  std::fclose(file);
  if (failed) MIXPREC_FAIL("cannot read IDX file '", path, "': ", std::strerror(error));
  return bytes;
}

// The decompressed bytes of a file's content, in order. gzip is recognised by its magic bytes
// 1f 8b; anything else is taken as raw IDX. Several concatenated gzip members (what
// `cat a.gz b.gz` makes, and what gzip itself accepts) read as one stream.
class ByteStream {
 public:
  ByteStream(std::span<const uint8_t> file, const std::string& path) : path_(path), file_(file) {
    gzip_ = file_.size() >= 2 && file_[0] == 0x1f && file_[1] == 0x8b;
    if (gzip_) {
      // 16 + MAX_WBITS: a gzip wrapper only; its CRC-32 and length are checked at the end.
      MIXPREC_CHECK(inflateInit2(&zs_, 16 + MAX_WBITS) == Z_OK, "IDX file '", path_,
                    "': cannot initialise zlib");
      inflating_ = true;
    }
  }
  ~ByteStream() {
    if (inflating_) inflateEnd(&zs_);
  }
  ByteStream(const ByteStream&) = delete;
  ByteStream& operator=(const ByteStream&) = delete;

  // Up to `n` bytes into `out`; fewer only at the end of the data.
  size_t read(uint8_t* out, size_t n) { return gzip_ ? inflate_into(out, n) : copy_into(out, n); }

  // At least as many bytes as read() can still deliver: exact for a raw file; for gzip,
  // deflate's largest ratio (1032:1) applied to the compressed bytes not yet inflated, plus a
  // margin for what zlib holds from bytes it has already taken.
  uint64_t max_remaining() const {
    const uint64_t unread = file_.size() - offset_;
    if (!gzip_) return unread;
    if (finished_) return 0;
    return (unread + zs_.avail_in) * 1032 + 65536;
  }

 private:
  size_t copy_into(uint8_t* out, size_t n) {
    const size_t count = std::min(n, file_.size() - offset_);
    if (count > 0) std::memcpy(out, file_.data() + offset_, count);
    offset_ += count;
    return count;
  }

  size_t inflate_into(uint8_t* out, size_t n) {
    size_t produced = 0;
    while (produced < n && !finished_) {
      if (zs_.avail_in == 0) {
        // zlib counts in 32-bit uInt, so a file past 4 GB is fed in slices.
        const size_t slice = std::min<size_t>(file_.size() - offset_, UINT_MAX);
        if (slice == 0) {
          MIXPREC_FAIL("IDX file '", path_, "': gzip stream ends early (the .gz file is "
                       "truncated after ", file_.size(), " bytes)");
        }
        // zlib's next_in is not const unless ZLIB_CONST; it never writes through it.
        zs_.next_in = const_cast<uint8_t*>(file_.data() + offset_);
        zs_.avail_in = static_cast<uInt>(slice);
        offset_ += slice;
      }
      const size_t want = std::min<size_t>(n - produced, UINT_MAX);
      zs_.next_out = out + produced;
      zs_.avail_out = static_cast<uInt>(want);
      const int rc = inflate(&zs_, Z_NO_FLUSH);
      produced += want - zs_.avail_out;
      if (rc == Z_STREAM_END) {
        end_member();
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        MIXPREC_FAIL("IDX file '", path_, "': corrupt gzip stream (zlib: ",
                     zs_.msg != nullptr ? zs_.msg : zError(rc), ")");
      }
    }
    return produced;
  }

  // One gzip member is complete (its CRC matched): go on with the next one, if any.
  void end_member() {
    const size_t unread = zs_.avail_in + (file_.size() - offset_);
    if (unread == 0) {
      finished_ = true;
      return;
    }
    const uint8_t* next = zs_.avail_in > 0 ? zs_.next_in : file_.data() + offset_;
    if (unread >= 2 && next[0] == 0x1f && next[1] == 0x8b) {
      inflateReset(&zs_);
      return;
    }
    MIXPREC_FAIL("IDX file '", path_, "': ", unread,
                 " bytes after the end of the gzip stream are not gzip data");
  }

  std::string path_;
  std::span<const uint8_t> file_;  // the caller's bytes, alive while the stream is
  size_t offset_ = 0;  // next unread byte of file_ (raw) or next byte to hand to zlib (gzip)
  bool gzip_ = false;
  z_stream zs_{};
  bool inflating_ = false;
  bool finished_ = false;
};

// Reads the header (magic and `dims` extents), checking the magic before the length so that a
// short file of the wrong kind says what it is.
std::vector<uint32_t> read_header(ByteStream& stream, const std::string& path, uint32_t magic,
                                  const char* what) {
  const size_t dims = magic & 0xff;
  uint8_t header[16];
  const size_t size = 4 + 4 * dims;
  const size_t got = stream.read(header, size);
  if (got >= 4) {
    const uint32_t found = big_endian_u32(header);
    if (found != magic) {
      std::string hint;
      if (found == kImagesMagic) hint = " (that is an IDX image file)";
      if (found == kLabelsMagic) hint = " (that is an IDX label file)";
      if (header[0] == 'P' && header[1] == 'K') hint = " (that is a zip archive, not gzip)";
      MIXPREC_FAIL("IDX file '", path, "': wrong magic ", hex32(found), hint, ", expected ",
                   hex32(magic), " for ", what);
    }
  }
  MIXPREC_CHECK(got == size, "IDX file '", path, "': truncated header: expected ", size,
                " bytes, found ", got);
  std::vector<uint32_t> extents(dims);
  for (size_t d = 0; d < dims; ++d) extents[d] = big_endian_u32(header + 4 + 4 * d);
  return extents;
}

// Reads exactly `expected` bytes, then checks that nothing follows.
std::vector<uint8_t> read_body(ByteStream& stream, const std::string& path, uint64_t expected,
                               const char* what) {
  std::vector<uint8_t> body;
  // Grow with the data, never past what the stream can still deliver, rather than trusting
  // the header: a 20-byte file that announces 100000 images fails as truncated without first
  // allocating (and zero-filling) megabytes for them.
  body.reserve(static_cast<size_t>(std::min<uint64_t>(expected, stream.max_remaining())));
  constexpr uint64_t kChunk = uint64_t{1} << 20;
  while (body.size() < expected) {
    const size_t old_size = body.size();
    const size_t want = static_cast<size_t>(
        std::min({expected - old_size, kChunk, stream.max_remaining()}));
    if (want == 0) break;
    body.resize(old_size + want);
    const size_t got = stream.read(body.data() + old_size, want);
    body.resize(old_size + got);
    if (got < want) break;
  }
  MIXPREC_CHECK(body.size() == expected, "IDX file '", path, "': truncated: expected ", expected,
                " bytes of ", what, ", found ", body.size());
  uint64_t trailing = 0;
  uint8_t scratch[1 << 14];
  for (size_t got; (got = stream.read(scratch, sizeof(scratch))) > 0;) trailing += got;
  MIXPREC_CHECK(trailing == 0, "IDX file '", path, "': ", trailing, " trailing bytes after the ",
                expected, " bytes of ", what, " the header announces");
  return body;
}

}  // namespace

IdxImages read_idx_images(std::span<const uint8_t> bytes, const std::string& path) {
  ByteStream stream(bytes, path);
  const std::vector<uint32_t> extents = read_header(stream, path, kImagesMagic, "images");
  const uint32_t count = extents[0], rows = extents[1], cols = extents[2];
  MIXPREC_CHECK(count > 0, "IDX file '", path, "': the header announces zero images");
  MIXPREC_CHECK(rows >= 1 && rows <= kMaxSide && cols >= 1 && cols <= kMaxSide, "IDX file '",
                path, "': image size ", rows, "x", cols, " is invalid (rows and cols must be in "
                "[1, ", kMaxSide, "])");
  IdxImages images;
  images.count = count;
  images.rows = rows;
  images.cols = cols;
  // Below 2^32 * 2^16 * 2^16 = 2^64: the product cannot overflow.
  const uint64_t expected = uint64_t{count} * rows * cols;
  images.pixels = read_body(stream, path, expected, "pixels");
  return images;
}

std::vector<uint8_t> read_idx_labels(std::span<const uint8_t> bytes, const std::string& path) {
  ByteStream stream(bytes, path);
  const std::vector<uint32_t> extents = read_header(stream, path, kLabelsMagic, "labels");
  MIXPREC_CHECK(extents[0] > 0, "IDX file '", path, "': the header announces zero labels");
  return read_body(stream, path, extents[0], "labels");
}

IdxImages read_idx_images(const std::string& path) {
  return read_idx_images(read_whole_file(path), path);
}

std::vector<uint8_t> read_idx_labels(const std::string& path) {
  return read_idx_labels(read_whole_file(path), path);
}

}  // namespace mixprec
