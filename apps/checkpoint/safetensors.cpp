// safetensors reading and writing. The reader trusts nothing in the file: every length and
// offset is checked against the file's size before anything is allocated or read, so a
// corrupt or hostile file gives an Error, never a crash or a huge allocation.
#include "apps/checkpoint/safetensors.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <set>

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "apps/checkpoint/atomic_file.h"
#include "apps/checkpoint/tensor_json.h"
#include "core/error.h"

namespace mixprec {
namespace {

// The data is the host's bytes as they are; the format is little-endian.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

constexpr const char* kMetadataKey = "__metadata__";

// Stored dtypes that are read; I64 becomes I32.
struct StoredDType {
  DType dtype;
  size_t size;  // bytes per element in the file
};

std::optional<StoredDType> stored_dtype(const std::string& name) {
  if (name == "F32") return StoredDType{DType::F32, 4};
  if (name == "F16") return StoredDType{DType::F16, 2};
  if (name == "BF16") return StoredDType{DType::BF16, 2};
  if (name == "I32") return StoredDType{DType::I32, 4};
  if (name == "I64") return StoredDType{DType::I32, 8};
  return std::nullopt;
}

struct Entry {
  std::string name;
  DType dtype;
  size_t stored_size;
  Shape shape;
  uint64_t begin;
  uint64_t end;
};

// A non-negative JSON integer, or nothing (floats, negatives, strings).
std::optional<uint64_t> as_index(const nlohmann::json& value) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer() && value.get<int64_t>() >= 0) {
    return static_cast<uint64_t>(value.get<int64_t>());
  }
  return std::nullopt;
}

Entry parse_entry(const std::string& path, const std::string& name,
                  const nlohmann::json& info) {
  const auto where = [&] { return detail::concat("'", path, "': tensor '", name, "'"); };
  MIXPREC_CHECK(info.is_object(), where(), ": expected an object, got ", info.type_name());
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    MIXPREC_CHECK(info.contains(key), where(), " has no \"", key, "\"");
  }
  const nlohmann::json& dtype = info["dtype"];
  MIXPREC_CHECK(dtype.is_string(), where(), ": dtype is ", json_excerpt(dtype), ", not a string");
  const std::optional<StoredDType> stored = stored_dtype(dtype.get<std::string>());
  MIXPREC_CHECK(stored.has_value(), where(), " has unsupported dtype ", json_excerpt(dtype),
                " (F32, F16, BF16, I32 and I64 are read)");

  Entry entry{name, stored->dtype, stored->size, {}, 0, 0};
  const nlohmann::json& shape = info["shape"];
  MIXPREC_CHECK(shape.is_array(), where(), ": shape is ", json_excerpt(shape), ", not an array");
  // The byte count is computed in 64 bits with overflow checks: a shape of [2^40, 2^40]
  // must be an error, not wrap around to a small number that matches its offsets.
  constexpr uint64_t kMaxExtent = std::numeric_limits<int64_t>::max();
  uint64_t nbytes = stored->size;
  bool overflow = false;
  for (const auto& extent : shape) {
    const std::optional<uint64_t> value = as_index(extent);
    MIXPREC_CHECK(value.has_value() && *value <= kMaxExtent, where(), ": shape ",
                  json_excerpt(shape), " holds ", json_excerpt(extent),
                  ", not a non-negative integer");
    entry.shape.push_back(static_cast<int64_t>(*value));
    overflow = overflow || __builtin_mul_overflow(nbytes, *value, &nbytes);
  }
  const nlohmann::json& offsets = info["data_offsets"];
  MIXPREC_CHECK(offsets.is_array() && offsets.size() == 2, where(), ": data_offsets is ",
                json_excerpt(offsets), ", not [begin, end]");
  const std::optional<uint64_t> begin = as_index(offsets[0]);
  const std::optional<uint64_t> end = as_index(offsets[1]);
  MIXPREC_CHECK(begin && end, where(), ": data_offsets ", json_excerpt(offsets),
                " are not non-negative integers");
  MIXPREC_CHECK(*begin <= *end, where(), ": data_offsets ", json_excerpt(offsets),
                " are out of order");
  entry.begin = *begin;
  entry.end = *end;
  MIXPREC_CHECK(!overflow, where(), ": shape ", shape_str(entry.shape),
                " has too many bytes to count in 64 bits");
  MIXPREC_CHECK(nbytes == entry.end - entry.begin, where(), ": ", dtype.get<std::string>(), " ",
                shape_str(entry.shape), " needs ", nbytes, " bytes, but data_offsets ",
                json_excerpt(offsets), " hold ", entry.end - entry.begin);
  return entry;
}

// Closes the FILE* on every path out of read_safetensors.
struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};

// Where the reader gets its bytes, front to back: a file, or a file's content in memory. Both
// readers run the same checks through read_from.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Exactly `size` bytes into `out`, or an Error naming `what` was being read.
  virtual void read(void* out, size_t size, const char* what) = 0;
};

class FileSource : public ByteSource {
 public:
  FileSource(std::FILE* file, const std::string& path) : file_(file), path_(path) {}
  void read(void* out, size_t size, const char* what) override {
    if (size == 0) return;
    if (std::fread(out, 1, size, file_) != size) {
      const int error = errno;
      MIXPREC_FAIL("'", path_, "': reading ", what, " failed: ",
                   std::ferror(file_) ? std::strerror(error) : "unexpected end of file");
    }
  }

 private:
  std::FILE* file_;
  const std::string& path_;
};

class MemorySource : public ByteSource {
 public:
  MemorySource(std::span<const uint8_t> bytes, const std::string& name)
      : bytes_(bytes), name_(name) {}
  void read(void* out, size_t size, const char* what) override {
    if (size == 0) return;
    MIXPREC_CHECK(size <= bytes_.size() - offset_, "'", name_, "': reading ", what,
                  " failed: unexpected end of data");
    std::memcpy(out, bytes_.data() + offset_, size);
    offset_ += size;
  }

 private:
  std::span<const uint8_t> bytes_;
  const std::string& name_;
  size_t offset_ = 0;
};

}  // namespace

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps the entries in the order given, as in the data, with __metadata__
  // first as the reference implementation writes it.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;

  std::vector<Tensor> host;
  host.reserve(tensors.size());
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    MIXPREC_CHECK(name != kMetadataKey, "cannot write '", path, "': \"", kMetadataKey,
                  "\" is reserved and cannot name a tensor");
    MIXPREC_CHECK(names.insert(name).second, "cannot write '", path, "': tensor name '", name,
                  "' appears twice");
    MIXPREC_CHECK(tensor.defined(), "cannot write '", path, "': tensor '", name,
                  "' is undefined");
    host.push_back(tensor.to(kCPU));
    const uint64_t nbytes = host.back().nbytes();
    header[name] = {{"dtype", std::string(dtype_name(tensor.dtype()))},
                    {"shape", tensor.shape()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }

  std::string text;
  try {
    // Strict UTF-8: a name that is not valid UTF-8 would make a file others cannot parse.
    text = header.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
  } catch (const nlohmann::json::exception& e) {
    MIXPREC_FAIL("cannot write '", path, "': a tensor name or metadata string is not valid "
                 "UTF-8 (", e.what(), ")");
  }
  // Spaces up to a multiple of 8, as the reference implementation pads, so that the data
  // starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_size = text.size();

  AtomicFile file(path);
  file.write(&header_size, sizeof(header_size));
  file.write(text.data(), text.size());
  for (const Tensor& tensor : host) file.write(tensor.data(), tensor.nbytes());
  file.commit();
}

namespace {

// The whole format, from `source` that holds `file_size` bytes.
SafetensorsFile read_from(ByteSource& source, uint64_t file_size, const std::string& path) {
  MIXPREC_CHECK(file_size >= 8, "'", path, "': ", file_size,
                " bytes is too short for a safetensors file (8-byte header length missing)");

  uint64_t header_size = 0;
  source.read(&header_size, sizeof(header_size), "the header length");
  MIXPREC_CHECK(header_size <= file_size - 8, "'", path, "': header length ", header_size,
                " goes beyond the end of the file (", file_size, " bytes)");
  std::string text(header_size, '\0');
  source.read(text.data(), text.size(), "the header");

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // parse_error, and out_of_range for a number beyond double's range such as 1e400.
    MIXPREC_FAIL("'", path, "': the header is not valid JSON: ", e.what());
  }
  MIXPREC_CHECK(header.is_object(), "'", path, "': the header is a JSON ", header.type_name(),
                ", not an object");

  SafetensorsFile out;
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      MIXPREC_CHECK(value.is_object(), "'", path, "': \"", kMetadataKey, "\" is a ",
                    value.type_name(), ", not an object of strings");
      for (const auto& [key, item] : value.items()) {
        MIXPREC_CHECK(item.is_string(), "'", path, "': \"", kMetadataKey, "\" entry '", key,
                      "' is ", json_excerpt(item), ", not a string");
        out.metadata[key] = item.get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(path, name, value));
  }

  // In order of their offsets the entries must tile the data exactly: the first at 0, each
  // where the previous one ends, the last at the end of the file.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const uint64_t data_size = file_size - 8 - header_size;
  uint64_t expected = 0;
  const Entry* previous = nullptr;
  for (const Entry& entry : entries) {
    MIXPREC_CHECK(entry.begin >= expected, "'", path, "': tensor '", entry.name,
                  "' (data_offsets [", entry.begin, ", ", entry.end, "]) overlaps tensor '",
                  previous ? previous->name : "", "' (ending at ", expected, ")");
    MIXPREC_CHECK(entry.begin == expected, "'", path, "': a gap of ", entry.begin - expected,
                  " bytes before tensor '", entry.name, "' (data_offsets [", entry.begin, ", ",
                  entry.end, "])");
    MIXPREC_CHECK(entry.end <= data_size, "'", path, "': tensor '", entry.name,
                  "' (data_offsets [", entry.begin, ", ", entry.end,
                  "]) goes beyond the end of the file (", data_size,
                  " bytes of data after the header)");
    expected = entry.end;
    previous = &entry;
  }
  MIXPREC_CHECK(expected == data_size, "'", path, "': ", data_size - expected,
                " bytes after the last tensor's data (the offsets end at ", expected, " of ",
                data_size, ")");

  // Every size is now bounded by the file's, so the allocations below are safe.
  for (const Entry& entry : entries) {
    Tensor tensor = Tensor::empty(entry.shape, entry.dtype);
    const std::string what = "tensor '" + entry.name + "'";
    if (entry.stored_size == dtype_size(entry.dtype)) {
      source.read(tensor.data(), entry.end - entry.begin, what.c_str());
    } else {
      // I64 narrowed to I32: every value must fit.
      std::vector<int64_t> wide(static_cast<size_t>(tensor.numel()));
      source.read(wide.data(), entry.end - entry.begin, what.c_str());
      int32_t* narrow = tensor.data_as<int32_t>();
      for (size_t i = 0; i < wide.size(); ++i) {
        MIXPREC_CHECK(wide[i] >= std::numeric_limits<int32_t>::min() &&
                          wide[i] <= std::numeric_limits<int32_t>::max(),
                      "'", path, "': I64 tensor '", entry.name, "' holds ", wide[i],
                      " at index ", i, ", which does not fit in I32");
        narrow[i] = static_cast<int32_t>(wide[i]);
      }
    }
    out.tensors.emplace(entry.name, std::move(tensor));
  }
  return out;
}

}  // namespace

SafetensorsFile read_safetensors(const std::string& path) {
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  if (!file) {
    const int error = errno;
    MIXPREC_FAIL("cannot read '", path, "': ", std::strerror(error));
  }
  struct stat info {};
  if (::fstat(::fileno(file.get()), &info) != 0) {
    const int error = errno;
    MIXPREC_FAIL("cannot read '", path, "': ", std::strerror(error));
  }
  MIXPREC_CHECK(S_ISREG(info.st_mode), "cannot read '", path, "': not a regular file");
  FileSource source(file.get(), path);
  return read_from(source, static_cast<uint64_t>(info.st_size), path);
}

SafetensorsFile read_safetensors(std::span<const uint8_t> bytes, const std::string& name) {
  MemorySource source(bytes, name);
  return read_from(source, bytes.size(), name);
}

}  // namespace mixprec
