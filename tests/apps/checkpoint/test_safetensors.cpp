// safetensors files against the format itself: bytes laid out by hand (header length, JSON,
// little-endian data) are compared with what is written, and hand-made files, valid and
// broken, are read.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/checkpoint/safetensors.h"
#include "core/error.h"
#include "tests/tensor_bytes.h"

using mixprec_test::raw_bytes;
using mixprec_test::tensor_from_bytes;

namespace {

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using mixprec::DType;
using mixprec::Tensor;

// A fresh folder under the system's temporary folder, removed at the end of the test.
class TempFolder {
 public:
  TempFolder() {
    static int counter = 0;
    path_ = fs::temp_directory_path() / ("mixprec_safetensors_test_" + std::to_string(::getpid()) +
                                         "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempFolder() {
    std::error_code error;
    fs::remove_all(path_, error);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

void append_u64(std::vector<uint8_t>& out, uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(value >> (8 * i)));
}

// A safetensors file built byte by byte: the header length as 8 little-endian bytes (the
// real length unless `claimed_length` is given), the header text unpadded, then `data`.
void write_raw(const std::string& path, const std::string& header, const std::vector<uint8_t>& data,
               uint64_t claimed_length = 0) {
  std::vector<uint8_t> bytes;
  append_u64(bytes, claimed_length ? claimed_length : header.size());
  bytes.insert(bytes.end(), header.begin(), header.end());
  bytes.insert(bytes.end(), data.begin(), data.end());
  write_bytes(path, bytes);
}

template <class T>
std::vector<uint8_t> le_bytes(const std::vector<T>& values) {
  std::vector<uint8_t> out;
  for (T value : values) {
    using U = std::make_unsigned_t<T>;
    const U bits = static_cast<U>(value);
    for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<uint8_t>(bits >> (8 * i)));
  }
  return out;
}

std::vector<uint8_t> f32_bits(const std::vector<uint32_t>& bits) { return le_bytes(bits); }

// The message of the Error that reading `path` throws.
std::string read_error(const std::string& path) {
  try {
    mixprec::read_safetensors(path);
  } catch (const mixprec::Error& e) {
    return e.what();
  }
  FAIL("reading '" << path << "' did not throw");
  return {};
}

}  // namespace

TEST_CASE("safetensors: round trip of every dtype is bit-exact", "[apps][checkpoint]") {
  TempFolder folder;
  const std::string path = folder.file("model.safetensors");
  // Bit patterns that a conversion through float would change: -0, a NaN with a payload,
  // a subnormal, infinity, the largest finite values.
  const Tensor f32 = tensor_from_bytes(
      f32_bits({0x3F800000u, 0x80000000u, 0x7FC00123u, 0x00000001u, 0xFF800000u, 0x7F7FFFFFu}),
      {2, 3}, DType::F32);
  const Tensor f16 = tensor_from_bytes(le_bytes<uint16_t>({0x3C00, 0x8000, 0x7E01, 0x0001, 0x7BFF}),
                                       {5}, DType::F16);
  const Tensor bf16 = tensor_from_bytes(le_bytes<uint16_t>({0x3F80, 0xFFC1, 0x0001, 0x7F7F}),
                                        {2, 1, 2}, DType::BF16);
  const Tensor i32 =
      tensor_from_bytes(le_bytes<int32_t>({0, -1, std::numeric_limits<int32_t>::min(),
                                           std::numeric_limits<int32_t>::max()}),
                        {4}, DType::I32);
  const Tensor scalar = tensor_from_bytes(f32_bits({0x40490FDBu}), {}, DType::F32);
  const Tensor empty = Tensor::empty({3, 0}, DType::BF16);

  const std::vector<std::pair<std::string, Tensor>> tensors = {
      {"w.f32", f32}, {"w.f16", f16},     {"w.bf16", bf16},
      {"ids", i32},   {"scalar", scalar}, {"empty", empty}};
  mixprec::write_safetensors(path, tensors, {{"format", "pt"}, {"step", "12"}});
  const mixprec::SafetensorsFile file = mixprec::read_safetensors(path);

  REQUIRE(file.tensors.size() == tensors.size());
  for (const auto& [name, expected] : tensors) {
    INFO(name);
    REQUIRE(file.tensors.count(name) == 1);
    const Tensor& got = file.tensors.at(name);
    CHECK(got.dtype() == expected.dtype());
    CHECK(got.shape() == expected.shape());
    CHECK(got.device() == mixprec::kCPU);
    CHECK(raw_bytes(got) == raw_bytes(expected));
  }
  CHECK(file.tensors.at("scalar").dim() == 0);
  CHECK(file.metadata == std::map<std::string, std::string>{{"format", "pt"}, {"step", "12"}});
  // Nothing but the file is left in the folder: the temporary file was renamed.
  CHECK(std::distance(fs::directory_iterator(folder.path()), fs::directory_iterator()) == 1);
}

TEST_CASE("safetensors: written bytes follow the format", "[apps][checkpoint]") {
  TempFolder folder;
  const std::string path = folder.file("tiny.safetensors");
  // Given order: "zeta" first, so its data comes first although "alpha" sorts before it.
  mixprec::write_safetensors(path,
                             {{"zeta", Tensor::from_ints({7, -2}, {2})},
                              {"alpha", Tensor::from_vector({1.0f}, {1}, DType::F32)},
                              {"half", Tensor::from_vector({1.0f}, {}, DType::F16)}},
                             {{"k", "v"}});
  const std::vector<uint8_t> bytes = read_bytes(path);
  REQUIRE(bytes.size() >= 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  CHECK(n % 8 == 0);
  // Data: 8 bytes of I32, 4 of F32, 2 of F16.
  REQUIRE(bytes.size() == 8 + n + 14);

  const std::string header(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(n));
  CHECK(header.front() == '{');
  // Padding is spaces only, and fewer than 8 of them.
  const size_t json_end = header.find_last_not_of(' ') + 1;
  CHECK(header[json_end - 1] == '}');
  CHECK(header.size() - json_end < 8);
  const nlohmann::json parsed = nlohmann::json::parse(header);
  const nlohmann::json expected = {
      {"__metadata__", {{"k", "v"}}},
      {"zeta", {{"dtype", "I32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}},
      {"alpha", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {8, 12}}}},
      {"half", {{"dtype", "F16"}, {"shape", nlohmann::json::array()}, {"data_offsets", {12, 14}}}}};
  CHECK(parsed == expected);

  const std::vector<uint8_t> data(bytes.begin() + 8 + static_cast<long>(n), bytes.end());
  const std::vector<uint8_t> expected_data = {0x07, 0x00, 0x00, 0x00, 0xFE,
                                              0xFF, 0xFF, 0xFF,  // 7, -2 as little-endian int32
                                              0x00, 0x00, 0x80, 0x3F,  // 1.0f = 0x3F800000
                                              0x00, 0x3C};             // 1.0 in FP16 = 0x3C00
  CHECK(data == expected_data);
}

TEST_CASE("safetensors: writing an empty list gives a valid file", "[apps][checkpoint]") {
  TempFolder folder;
  const std::string path = folder.file("empty.safetensors");
  mixprec::write_safetensors(path, {});
  const std::vector<uint8_t> bytes = read_bytes(path);
  // "{}" padded to 8: length 8, then "{}      ".
  REQUIRE(bytes.size() == 16);
  CHECK(bytes[0] == 8);
  CHECK(std::string(bytes.begin() + 8, bytes.end()) == "{}      ");
  const auto file = mixprec::read_safetensors(path);
  CHECK(file.tensors.empty());
  CHECK(file.metadata.empty());
}

TEST_CASE("safetensors: hand-written files with I64 and any order are read", "[apps][checkpoint]") {
  TempFolder folder;
  const std::string path = folder.file("hand.safetensors");
  // Unpadded header, keys not in data order, I64 data.
  const std::string header =
      R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[24,28]},)"
      R"("ids":{"dtype":"I64","shape":[3],"data_offsets":[0,24]},"__metadata__":{"a":"b"}})";
  std::vector<uint8_t> data = le_bytes<int64_t>({1, -2, 2147483647});
  const std::vector<uint8_t> w = {0x00, 0x00, 0x00, 0xC0};  // -2.0f
  data.insert(data.end(), w.begin(), w.end());
  write_raw(path, header, data);

  const auto file = mixprec::read_safetensors(path);
  REQUIRE(file.tensors.count("ids") == 1);
  const Tensor& ids = file.tensors.at("ids");
  CHECK(ids.dtype() == DType::I32);
  CHECK(ids.shape() == mixprec::Shape{3});
  CHECK(ids.to_int_vector() == std::vector<int32_t>{1, -2, 2147483647});
  CHECK(file.tensors.at("w").to_float_vector() == std::vector<float>{-2.0f});
  CHECK(file.metadata.at("a") == "b");

  SECTION("an I64 value outside int32 is an error") {
    write_raw(path, R"({"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})",
              le_bytes<int64_t>({5, int64_t{1} << 31}));
    const std::string message = read_error(path);
    CHECK_THAT(message, Contains(path) && Contains("2147483648") && Contains("ids"));
  }
}

TEST_CASE("safetensors: broken files give errors naming the file", "[apps][checkpoint]") {
  TempFolder folder;
  const std::string path = folder.file("bad.safetensors");
  const std::vector<uint8_t> eight(8, 0);

  SECTION("missing file") {
    CHECK_THAT(read_error(folder.file("nope.safetensors")),
               Contains("nope.safetensors") && Contains("No such file"));
  }
  SECTION("a folder") {
    CHECK_THAT(read_error(folder.path().string()), Contains(folder.path().string()));
  }
  SECTION("shorter than 8 bytes") {
    write_bytes(path, {1, 2, 3});
    CHECK_THAT(read_error(path), Contains(path) && Contains("too short"));
  }
  SECTION("header length beyond the file") {
    write_raw(path, "{}", {}, 100);
    CHECK_THAT(read_error(path), Contains(path) && Contains("header length 100"));
  }
  SECTION("header length 2^60 is an Error, not an allocation") {
    write_raw(path, "{}", {}, uint64_t{1} << 60);
    CHECK_THAT(read_error(path), Contains(path) && Contains("beyond the end"));
  }
  SECTION("truncated inside the data") {
    mixprec::write_safetensors(path, {{"x", Tensor::zeros({4})}});
    std::vector<uint8_t> bytes = read_bytes(path);
    bytes.resize(bytes.size() - 3);
    write_bytes(path, bytes);
    CHECK_THAT(read_error(path), Contains(path) && Contains("'x'") && Contains("beyond the end"));
  }
  SECTION("truncated inside the header") {
    mixprec::write_safetensors(path, {{"x", Tensor::zeros({4})}});
    std::vector<uint8_t> bytes = read_bytes(path);
    bytes.resize(20);
    write_bytes(path, bytes);
    CHECK_THAT(read_error(path), Contains(path) && Contains("beyond the end"));
  }
  SECTION("header not JSON") {
    write_raw(path, "{not json", eight);
    CHECK_THAT(read_error(path), Contains(path) && Contains("not valid JSON"));
  }
  SECTION("a number beyond double's range in the header") {
    // What the fuzzer found: nlohmann::json throws out_of_range, not parse_error, for a
    // number that overflows double.
    write_raw(path, R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[60,460.88E888888884]}})",
              eight);
    CHECK_THAT(read_error(path), Contains(path) && Contains("not valid JSON") &&
                                     Contains("number overflow"));
  }
  SECTION("header not an object") {
    write_raw(path, "[1, 2]", {});
    CHECK_THAT(read_error(path), Contains(path) && Contains("not an object"));
  }
  SECTION("entry not an object") {
    write_raw(path, R"({"x": 3})", {});
    CHECK_THAT(read_error(path), Contains(path) && Contains("'x'"));
  }
  SECTION("missing fields") {
    for (const std::string missing : {"dtype", "shape", "data_offsets"}) {
      nlohmann::json entry = {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}};
      entry.erase(missing);
      write_raw(path, nlohmann::json{{"x", entry}}.dump(), eight);
      CHECK_THAT(read_error(path), Contains(path) && Contains("'x'") && Contains(missing));
    }
  }
  SECTION("unsupported or misspelt dtype") {
    for (const std::string dtype : {"F64", "U8", "BOOL", "f32", "float32"}) {
      write_raw(path, R"({"x":{"dtype":")" + dtype + R"(","shape":[2],"data_offsets":[0,8]}})",
                eight);
      CHECK_THAT(read_error(path), Contains(path) && Contains(dtype) && Contains("unsupported"));
    }
  }
  SECTION("dtype not a string") {
    write_raw(path, R"({"x":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", eight);
    CHECK_THAT(read_error(path), Contains(path) && Contains("dtype"));
  }
  SECTION("bad shape") {
    for (const std::string shape : {"[-2]", "[2.0]", "[\"2\"]", "3"}) {
      write_raw(path, R"({"x":{"dtype":"F32","shape":)" + shape + R"(,"data_offsets":[0,8]}})",
                eight);
      CHECK_THAT(read_error(path), Contains(path) && Contains("shape"));
    }
  }
  SECTION("bad data_offsets") {
    for (const std::string offsets : {"[0]", "[0, 8, 9]", "[-1, 7]", "{}", "[0, 8.5]"}) {
      write_raw(path, R"({"x":{"dtype":"F32","shape":[2],"data_offsets":)" + offsets + "}}", eight);
      CHECK_THAT(read_error(path), Contains(path) && Contains("data_offsets"));
    }
  }
  SECTION("offsets out of order") {
    write_raw(path, R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", eight);
    CHECK_THAT(read_error(path), Contains(path) && Contains("out of order"));
  }
  SECTION("size does not match shape x dtype") {
    write_raw(path, R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight);
    CHECK_THAT(read_error(path), Contains(path) && Contains("'x'") && Contains("needs 12 bytes"));
    write_raw(path, R"({"x":{"dtype":"I64","shape":[2],"data_offsets":[0,8]}})", eight);
    CHECK_THAT(read_error(path), Contains(path) && Contains("needs 16 bytes"));
  }
  SECTION("a shape too large to count is an error, not an allocation") {
    write_raw(path,
              R"({"x":{"dtype":"F32","shape":[1099511627776,1099511627776,1099511627776],)"
              R"("data_offsets":[0,8]}})",
              eight);
    CHECK_THAT(read_error(path), Contains(path) && Contains("'x'"));
  }
  SECTION("overlapping offsets") {
    write_raw(path,
              R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
              R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
              std::vector<uint8_t>(12, 0));
    CHECK_THAT(read_error(path), Contains(path) && Contains("overlaps"));
  }
  SECTION("a gap between tensors") {
    write_raw(path,
              R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
              R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
              std::vector<uint8_t>(12, 0));
    CHECK_THAT(read_error(path), Contains(path) && Contains("gap") && Contains("'b'"));
  }
  SECTION("data not starting at offset 0") {
    write_raw(path, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight);
    CHECK_THAT(read_error(path), Contains(path) && Contains("gap"));
  }
  SECTION("data past the end of the file") {
    write_raw(path, R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", eight);
    CHECK_THAT(read_error(path), Contains(path) && Contains("beyond the end"));
  }
  SECTION("bytes after the last tensor") {
    write_raw(path, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", eight);
    CHECK_THAT(read_error(path), Contains(path) && Contains("after the last tensor"));
  }
  SECTION("__metadata__ not a map of strings") {
    write_raw(path, R"({"__metadata__":{"n":3}})", {});
    CHECK_THAT(read_error(path), Contains(path) && Contains("__metadata__"));
    write_raw(path, R"({"__metadata__":[]})", {});
    CHECK_THAT(read_error(path), Contains(path) && Contains("__metadata__"));
  }
}

TEST_CASE("safetensors: the in-memory reader reads and checks like the file reader",
          "[apps][checkpoint]") {
  // {"w": F32 [2] = {1.0, -2.0}} with the metadata {"k": "v"}, laid out by hand.
  const std::string header =
      R"({"__metadata__":{"k":"v"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::vector<uint8_t> bytes;
  append_u64(bytes, header.size());
  bytes.insert(bytes.end(), header.begin(), header.end());
  const std::vector<uint8_t> data = f32_bits({0x3F800000u, 0xC0000000u});
  bytes.insert(bytes.end(), data.begin(), data.end());

  const mixprec::SafetensorsFile file = mixprec::read_safetensors(bytes, "in memory");
  REQUIRE(file.tensors.size() == 1);
  const Tensor& w = file.tensors.at("w");
  CHECK(w.dtype() == DType::F32);
  CHECK(w.shape() == mixprec::Shape{2});
  CHECK(raw_bytes(w) == data);
  CHECK(file.metadata == std::map<std::string, std::string>{{"k", "v"}});

  // The same bytes, one short: the data ends early, and the error names what was given.
  bytes.pop_back();
  CHECK_THROWS_WITH(mixprec::read_safetensors(bytes, "in memory"),
                    Contains("'in memory'") && Contains("'w'") && Contains("beyond the end"));
  CHECK_THROWS_WITH(mixprec::read_safetensors(std::vector<uint8_t>(5, 0), "five bytes"),
                    Contains("'five bytes'") && Contains("too short"));
}

// Error messages quote JSON values from the header; quoting a value nested 200000 levels deep
// with dump() recursed once per level and overflowed the stack.
TEST_CASE("safetensors: a header value nested 200000 levels deep is an Error, not a crash",
          "[apps][checkpoint]") {
  TempFolder folder;
  const std::string path = folder.file("deep.safetensors");
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  const std::vector<uint8_t> four(4, 0);
  write_raw(path, R"({"x":{"dtype":)" + deep + R"(,"shape":[1],"data_offsets":[0,4]}})", four);
  CHECK_THAT(read_error(path), Contains(path) && Contains("'x'") &&
                                   Contains("an array nested more than 16 levels deep"));
  write_raw(path, R"({"x":{"dtype":"F32","shape":[)" + deep + R"(],"data_offsets":[0,4]}})",
            four);
  CHECK_THAT(read_error(path), Contains(path) && Contains("shape") &&
                                   Contains("nested more than 16 levels deep"));
  write_raw(path, R"({"__metadata__":{"k":)" + deep + "}}", {});
  CHECK_THAT(read_error(path), Contains(path) && Contains("__metadata__") &&
                                   Contains("nested more than 16 levels deep"));
}

TEST_CASE("safetensors: write errors name the file and leave nothing behind",
          "[apps][checkpoint]") {
  TempFolder folder;
  const std::string path = folder.file("model.safetensors");
  mixprec::write_safetensors(path, {{"x", Tensor::from_vector({1.0f, 2.0f}, {2})}});
  const std::vector<uint8_t> before = read_bytes(path);

  SECTION("duplicate names") {
    CHECK_THROWS_WITH(
        mixprec::write_safetensors(path, {{"y", Tensor::zeros({1})}, {"y", Tensor::zeros({2})}}),
        Contains(path) && Contains("'y'") && Contains("twice"));
  }
  SECTION("the reserved name") {
    CHECK_THROWS_WITH(mixprec::write_safetensors(path, {{"__metadata__", Tensor::zeros({1})}}),
                      Contains(path) && Contains("reserved"));
  }
  SECTION("an undefined tensor") {
    CHECK_THROWS_WITH(mixprec::write_safetensors(path, {{"u", Tensor()}}),
                      Contains(path) && Contains("'u'"));
  }
  SECTION("a name that is not UTF-8") {
    CHECK_THROWS_WITH(mixprec::write_safetensors(path, {{"bad\xff", Tensor::zeros({1})}}),
                      Contains(path) && Contains("UTF-8"));
  }
  // The old file is untouched and no temporary file remains.
  CHECK(read_bytes(path) == before);
  CHECK(std::distance(fs::directory_iterator(folder.path()), fs::directory_iterator()) == 1);
}

TEST_CASE("safetensors: a failed rename removes the temporary file", "[apps][checkpoint]") {
  TempFolder folder;
  // The target is a non-empty folder: the rename over it fails after the data was written.
  const std::string path = folder.file("occupied");
  fs::create_directories(fs::path(path) / "inside");
  CHECK_THROWS_WITH(mixprec::write_safetensors(path, {{"x", Tensor::zeros({2})}}),
                    Contains(path) && Contains("renaming"));
  CHECK(std::distance(fs::directory_iterator(folder.path()), fs::directory_iterator()) == 1);
  CHECK(fs::is_directory(fs::path(path) / "inside"));
}

TEST_CASE("safetensors: an unwritable folder is an error naming the path and the reason",
          "[apps][checkpoint]") {
  TempFolder folder;
  const std::string path = folder.file("missing/model.safetensors");
  CHECK_THROWS_WITH(mixprec::write_safetensors(path, {{"x", Tensor::zeros({2})}}),
                    Contains(path) && Contains("No such file or directory"));
}

TEST_CASE("safetensors: torch reads what is written", "[apps][checkpoint][python]") {
  if (std::system("python3 -c 'import torch, safetensors' >/dev/null 2>&1") != 0) {
    WARN("python3 with torch and safetensors is not installed: skipping the cross-check");
    return;
  }
  TempFolder folder;
  const std::string path = folder.file("model.safetensors");
  const std::string out = folder.file("out.txt");
  mixprec::write_safetensors(path,
                             {{"w", Tensor::from_vector({1.5f, -2.0f, 0.25f}, {3}, DType::F32)},
                              {"h", Tensor::from_vector({3.0f}, {1}, DType::F16)},
                              {"b", Tensor::from_vector({-0.5f}, {}, DType::BF16)},
                              {"i", Tensor::from_ints({-7, 9}, {2})}},
                             {{"step", "5"}});
  const std::string script =
      "import sys, torch\n"
      "from safetensors import safe_open\n"
      "with safe_open(sys.argv[1], 'pt') as f:\n"
      "    t = {k: f.get_tensor(k) for k in f.keys()}\n"
      "    m = f.metadata()\n"
      "with open(sys.argv[2], 'w') as o:\n"
      "    o.write(repr((t['w'].dtype, t['w'].tolist(), t['h'].dtype, t['h'].tolist(),\n"
      "                  t['b'].dtype, t['b'].dim(), t['b'].item(), t['i'].dtype,\n"
      "                  t['i'].tolist(), m['step'])))\n";
  const std::string script_path = folder.file("read.py");
  {
    std::ofstream s(script_path);
    s << script;
  }
  REQUIRE(std::system(("python3 '" + script_path + "' '" + path + "' '" + out + "'").c_str()) == 0);
  std::ifstream in(out);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  CHECK(text ==
        "(torch.float32, [1.5, -2.0, 0.25], torch.float16, [3.0], torch.bfloat16, 0, -0.5, "
        "torch.int32, [-7, 9], '5')");
}
