// Character text data: a small text whose every character is distinct, so that a window's
// first id tells where it starts; strict UTF-8; and tiny shakespeare's known numbers.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "apps/data/char_text.h"
#include "core/error.h"
#include "data_test_files.h"

using namespace mixprec;
using data_test::TempDir;

namespace {

// 60 distinct characters: position k holds U+0100 + (7k mod 60) (two bytes of UTF-8 each).
// The vocabulary is U+0100..U+013B, so the id at position k is (7k mod 60), and the position
// of id d is 43d mod 60 (7 * 43 = 301 = 1 mod 60).
constexpr int kLength = 60;
int id_at(int64_t position) { return static_cast<int>((7 * position) % kLength); }
int64_t position_of(int id) { return (43 * id) % kLength; }

std::string distinct_text() {
  std::string text;
  for (int k = 0; k < kLength; ++k) {
    const unsigned c = 0x100u + static_cast<unsigned>(id_at(k));
    text += static_cast<char>(0xc0 | (c >> 6));
    text += static_cast<char>(0x80 | (c & 0x3f));
  }
  return text;
}

// val_fraction 0.25: training split = positions [0, 45), validation [45, 60).
CharTextOptions distinct_options(const TempDir& dir) {
  CharTextOptions o;
  o.path = dir.file("distinct.txt");
  data_test::write_text(o.path, distinct_text());
  o.val_fraction = 0.25;
  o.block_size = 4;
  o.batch_size = 8;
  o.eval_batches = 2;
  return o;
}

// Checks that row i of `batch` is the window of the distinct text starting at `starts[i]`:
// inputs = ids at start..start+3, targets = ids at start+1..start+4.
void check_windows(const Batch& batch, const std::vector<int64_t>& starts, int64_t block) {
  const int64_t n = static_cast<int64_t>(starts.size());
  REQUIRE(batch.inputs.shape() == Shape{n, block});
  REQUIRE(batch.targets.shape() == Shape{n, block});
  REQUIRE(batch.inputs.dtype() == DType::I32);
  REQUIRE(batch.targets.dtype() == DType::I32);
  const std::vector<int32_t> x = batch.inputs.to_int_vector();
  const std::vector<int32_t> y = batch.targets.to_int_vector();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t t = 0; t < block; ++t) {
      INFO("window " << i << " (start " << starts[i] << "), position " << t);
      REQUIRE(x[i * block + t] == id_at(starts[i] + t));
      REQUIRE(y[i * block + t] == id_at(starts[i] + t + 1));
    }
  }
}

// Where each window of a batch of the distinct text starts.
std::vector<int64_t> starts_of(const Batch& batch) {
  std::vector<int64_t> out;
  const std::vector<int32_t> x = batch.inputs.to_int_vector();
  const int64_t block = batch.inputs.size(1);
  for (int64_t i = 0; i < batch.inputs.size(0); ++i) out.push_back(position_of(x[i * block]));
  return out;
}

bool same_text_batch(const Batch& a, const Batch& b) {
  return a.inputs.to_int_vector() == b.inputs.to_int_vector() &&
         a.targets.to_int_vector() == b.targets.to_int_vector() && a.number == b.number &&
         a.epoch == b.epoch;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_CASE("char text ids are the ranks of sorted code points", "[data][text]") {
  TempDir dir;
  CharTextOptions o = distinct_options(dir);
  const CharVocabulary vocab = char_vocabulary_of(o.path);
  REQUIRE(vocab.size() == kLength);
  for (int d = 0; d < kLength; ++d) CHECK(vocab.chars()[d] == static_cast<char32_t>(0x100 + d));
  const auto data = load_char_text(o);
  CHECK(data->num_classes() == kLength);
  CHECK(data->input_index_bound() == std::optional<int64_t>(kLength));
  CHECK_FALSE(data->is_classification());
  // Decoding a batch back through the vocabulary gives the text's characters.
  o.shuffle = false;
  const Batch batch = load_char_text(o)->train_batch(0);
  const std::vector<int32_t> ids = batch.inputs.to_int_vector();
  const std::vector<int32_t> row(ids.begin(), ids.begin() + 4);
  CHECK(vocab.decode(row) == distinct_text().substr(0, 8));
}

TEST_CASE("char text training windows start uniformly over the training split",
          "[data][text]") {
  TempDir dir;
  CharTextOptions o = distinct_options(dir);
  o.seed = 42;
  const auto data = load_char_text(o);
  // Starts 0..40: window [start, start + 4] must end inside the 45 training tokens.
  std::vector<int> seen(kLength, 0);
  for (int64_t n = 0; n < 250; ++n) {
    const Batch batch = data->train_batch(n);
    CHECK(batch.number == n);
    const std::vector<int64_t> starts = starts_of(batch);
    check_windows(batch, starts, 4);
    for (int64_t s : starts) ++seen[s];
  }
  // 2000 draws over 41 starts: about 49 each; every start, the first and the last included.
  for (int s = 0; s < kLength; ++s) {
    INFO("start " << s);
    if (s <= 40) {
      CHECK(seen[s] > 20);
      CHECK(seen[s] < 85);
    } else {
      CHECK(seen[s] == 0);
    }
  }
}

TEST_CASE("char text batches are a pure function of (seed, number)", "[data][text]") {
  TempDir dir;
  CharTextOptions o = distinct_options(dir);
  o.seed = 7;
  const auto data = load_char_text(o);
  const auto again = load_char_text(o);
  o.seed = 8;
  const auto other_seed = load_char_text(o);
  for (int64_t n : {0, 1, 5, 1000000}) {
    CHECK(same_text_batch(data->train_batch(n), again->train_batch(n)));
    CHECK(starts_of(data->train_batch(n)) != starts_of(other_seed->train_batch(n)));
  }
  CHECK(starts_of(data->train_batch(0)) != starts_of(data->train_batch(1)));
}

TEST_CASE("char text without shuffling walks the training split by block_size",
          "[data][text]") {
  TempDir dir;
  CharTextOptions o = distinct_options(dir);
  o.shuffle = false;
  o.batch_size = 3;
  const auto data = load_char_text(o);
  // Window w starts at 4w mod 41: 0, 4, ..., 40, then 3, 7, ...
  check_windows(data->train_batch(0), {0, 4, 8}, 4);
  check_windows(data->train_batch(3), {36, 40, 3}, 4);
  check_windows(data->train_batch(4), {7, 11, 15}, 4);
  // Window 41 * 3 = 123 is back at 0.
  check_windows(data->train_batch(41), {0, 4, 8}, 4);
}

TEST_CASE("char text evaluation windows are spread evenly over the validation split",
          "[data][text]") {
  TempDir dir;
  CharTextOptions o = distinct_options(dir);
  o.batch_size = 3;
  o.eval_batches = 2;
  o.seed = 1;
  const auto data = load_char_text(o);
  o.seed = 2;
  const auto other_seed = load_char_text(o);
  REQUIRE(data->eval_batch_count() == 2);
  // 15 validation tokens, 11 starts, 6 windows: 45 + floor(11j / 6) = 45, 46, 48, 50, 52, 54.
  check_windows(data->eval_batch(0), {45, 46, 48}, 4);
  check_windows(data->eval_batch(1), {50, 52, 54}, 4);
  CHECK(data->eval_batch(1).number == 1);
  for (int64_t m = 0; m < 2; ++m)
    CHECK(same_text_batch(data->eval_batch(m), other_seed->eval_batch(m)));
  CHECK_THROWS_WITH(data->eval_batch(2), Catch::Contains("evaluation batch 2 is out of range"));
  CHECK_THROWS_AS(data->train_batch(-1), Error);
}

TEST_CASE("char text epochs: train tokens / (batch_size * block_size), at least 1",
          "[data][text]") {
  TempDir dir;
  CharTextOptions o = distinct_options(dir);
  o.batch_size = 2;  // 45 / 8 = 5
  auto data = load_char_text(o);
  CHECK(data->batches_per_epoch() == 5);
  CHECK(data->train_batch(4).epoch == 0);
  CHECK(data->train_batch(5).epoch == 1);
  CHECK(data->train_batch(11).epoch == 2);
  o.batch_size = 16;  // 45 / 64 = 0, so 1
  data = load_char_text(o);
  CHECK(data->batches_per_epoch() == 1);
  CHECK(data->train_batch(3).epoch == 3);
}

TEST_CASE("CharVocabulary encodes and decodes UTF-8 by code point", "[data][text]") {
  TempDir dir;
  const std::string path = dir.file("mixed.txt");
  // a, e-acute (2 bytes), euro sign (3 bytes), musical G clef (4 bytes), a.
  data_test::write_text(path, "a\xc3\xa9\xe2\x82\xac\xf0\x9d\x84\x9e" "a");
  const CharVocabulary vocab = char_vocabulary_of(path);
  CHECK(vocab.chars() == std::vector<char32_t>{0x61, 0xe9, 0x20ac, 0x1d11e});
  const std::string text = "\xe2\x82\xac" "a\xf0\x9d\x84\x9e\xc3\xa9";
  CHECK(vocab.encode(text) == std::vector<int32_t>{2, 0, 3, 1});
  CHECK(vocab.decode({2, 0, 3, 1}) == text);
  CHECK_THROWS_WITH(vocab.encode("ab"), Catch::Contains("U+0062") && Catch::Contains("position 1"));
  CHECK_THROWS_WITH(vocab.decode({0, 4}), Catch::Contains("id 4") && Catch::Contains("[0, 4)"));
  CHECK_THROWS_WITH(vocab.encode("a\xff"), Catch::Contains("invalid UTF-8 at byte offset 1"));
  CHECK_THROWS_WITH(CharVocabulary({0x62, 0x61}), Catch::Contains("sorted and distinct"));
  CHECK_THROWS_WITH(CharVocabulary({0x61, 0x61}), Catch::Contains("sorted and distinct"));
  CHECK_THROWS_AS(CharVocabulary({0xd800}), Error);
}

TEST_CASE("char text rejects invalid UTF-8 with the byte offset", "[data][text]") {
  TempDir dir;
  struct Case {
    std::string bytes;
    size_t offset;
    const char* what;
  };
  const std::vector<Case> cases = {
      {"ab\xff" "cd", 2, "0xff is never UTF-8"},
      {"ab\x80", 2, "continuation byte without a lead"},
      {"abc\xe2\x82", 3, "file ends inside a three-byte sequence"},
      {"a\xc3(", 1, "two-byte sequence cut short"},
      {"\xe0\x80\xaf", 0, "overlong three-byte '/'"},
      {"xy\xc0\xaf", 2, "overlong two-byte '/'"},
      {"x\xed\xa0\x80", 1, "UTF-16 surrogate U+D800"},
      {"\xf4\x90\x80\x80", 0, "U+110000"},
      {"ok\xf5\x80\x80\x80", 2, "lead byte past U+10FFFF"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    CharTextOptions o;
    o.path = dir.file("bad.txt");
    data_test::write_text(o.path, c.bytes);
    const std::string expected = "invalid UTF-8 at byte offset " + std::to_string(c.offset) + " (";
    CHECK_THROWS_WITH(load_char_text(o), Catch::Contains(o.path) && Catch::Contains(expected));
    CHECK_THROWS_WITH(char_vocabulary_of(o.path), Catch::Contains(expected));
  }
}

TEST_CASE("char text errors name the file and the value", "[data][text]") {
  TempDir dir;
  CharTextOptions o;
  o.path = dir.file("hundred.txt");
  std::string hundred;
  for (int i = 0; i < 100; ++i) hundred += static_cast<char>('a' + i % 26);
  data_test::write_text(o.path, hundred);
  o.block_size = 8;
  REQUIRE_NOTHROW(load_char_text(o));

  SECTION("missing and empty files") {
    CharTextOptions bad = o;
    bad.path = dir.file("absent.txt");
    CHECK_THROWS_WITH(load_char_text(bad),
                      Catch::Contains(bad.path) && Catch::Contains("No such file or directory"));
    CHECK_THROWS_AS(char_vocabulary_of(bad.path), Error);
    bad.path = dir.file("empty.txt");
    data_test::write_text(bad.path, "");
    CHECK_THROWS_WITH(load_char_text(bad), Catch::Contains(bad.path) && Catch::EndsWith("is empty"));
    CHECK_THROWS_WITH(char_vocabulary_of(bad.path), Catch::EndsWith("is empty"));
  }
  SECTION("splits shorter than block_size + 1") {
    // 100 tokens, val_fraction 0.1: 90 / 10.
    o.block_size = 20;
    CHECK_THROWS_WITH(load_char_text(o),
                      Catch::Contains(o.path) &&
                          Catch::Contains("validation split has 10 tokens, block_size + 1 = 21 "
                                          "needed"));
    o.block_size = 9;
    CHECK_NOTHROW(load_char_text(o));
    // val_fraction 0.75: 25 / 75.
    o.val_fraction = 0.75;
    o.block_size = 30;
    CHECK_THROWS_WITH(load_char_text(o),
                      Catch::Contains("training split has 25 tokens, block_size + 1 = 31 needed"));
  }
  SECTION("options") {
    for (double fraction : {0.0, 1.0, -0.5, std::numeric_limits<double>::quiet_NaN()}) {
      o.val_fraction = fraction;
      CHECK_THROWS_WITH(load_char_text(o), Catch::Contains("val_fraction must be in (0, 1)"));
    }
    o.val_fraction = 0.1;
    o.block_size = 0;
    CHECK_THROWS_WITH(load_char_text(o), Catch::Contains("block_size must be >= 1, got 0"));
    o.block_size = 8;
    o.batch_size = 0;
    CHECK_THROWS_WITH(load_char_text(o), Catch::Contains("batch_size must be >= 1, got 0"));
  }
}

TEST_CASE("char text on tiny shakespeare", "[data][text][shakespeare]") {
  const std::string path = data_test::shared_data_file("tinyshakespeare/input.txt");
  if (path.empty()) {
    WARN("skipped: tinyshakespeare/input.txt not found in the data folders");
    return;
  }
  const std::string text = read_file(path);
  REQUIRE(text.size() == 1115394);

  const CharVocabulary vocab = char_vocabulary_of(path);
  CHECK(vocab.size() == 65);
  // nanoGPT's shakespeare_char/prepare.py prints this vocabulary.
  const std::string expected_chars =
      "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  CHECK(vocab.chars() == std::vector<char32_t>(expected_chars.begin(), expected_chars.end()));

  CharTextOptions o;
  o.path = path;
  o.block_size = 16;
  o.batch_size = 4;
  o.seed = 1337;
  const auto data = load_char_text(o);
  CHECK(data->num_classes() == 65);
  // And its split: "train has 1,003,854 tokens", "val has 111,540 tokens".
  const int64_t train_tokens = 1003854;
  CHECK(data->describe() == "character text '" + path +
                                "': 1115394 characters, 65 distinct; 1003854 train / 111540 "
                                "validation tokens, windows of 16");
  CHECK(data->batches_per_epoch() == train_tokens / (4 * 16));
  // The first evaluation window is the first 17 characters of the validation split.
  const Batch eval = data->eval_batch(0);
  const std::vector<int32_t> eval_x = eval.inputs.to_int_vector();
  CHECK(vocab.decode(std::vector<int32_t>(eval_x.begin(), eval_x.begin() + 16)) ==
        text.substr(train_tokens, 16));

  // Random windows: each is 17 consecutive characters of the training split, the targets the
  // inputs shifted by one.
  const std::string train_text = text.substr(0, train_tokens);
  for (int64_t n = 0; n < 5; ++n) {
    const Batch batch = data->train_batch(n);
    const std::vector<int32_t> x = batch.inputs.to_int_vector();
    const std::vector<int32_t> y = batch.targets.to_int_vector();
    for (int64_t i = 0; i < 4; ++i) {
      const std::vector<int32_t> xi(x.begin() + i * 16, x.begin() + (i + 1) * 16);
      const std::vector<int32_t> yi(y.begin() + i * 16, y.begin() + (i + 1) * 16);
      const std::string window = vocab.decode(xi) + vocab.decode({yi.back()});
      CHECK(train_text.find(window) != std::string::npos);
      CHECK(vocab.decode(yi) == window.substr(1));
    }
  }

  // Without shuffling, the first window is the start of the play.
  o.shuffle = false;
  const Batch first = load_char_text(o)->train_batch(0);
  const std::vector<int32_t> x = first.inputs.to_int_vector();
  CHECK(vocab.decode(std::vector<int32_t>(x.begin(), x.begin() + 16)) == "First Citizen:\nB");
  CHECK(vocab.decode(std::vector<int32_t>(x.begin() + 16, x.begin() + 32)) == text.substr(16, 16));
}
