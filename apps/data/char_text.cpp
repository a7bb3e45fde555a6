// Character-level text data. The whole file is decoded to token ids once at load; a batch is
// then a handful of copies out of that array, at positions that depend only on
// (seed, batch number).
#include "apps/data/char_text.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iomanip>
#include <sstream>
#include <utility>

#include "core/error.h"
#include "core/philox.h"

namespace mixprec {
namespace {

std::string hex_byte(uint8_t byte) {
  std::ostringstream out;
  out << "0x" << std::hex << std::setw(2) << std::setfill('0') << static_cast<int>(byte);
  return out.str();
}

std::string code_point_name(char32_t c) {
  std::ostringstream out;
  out << "U+" << std::hex << std::uppercase << std::setw(4) << std::setfill('0')
      << static_cast<uint32_t>(c);
  return out.str();
}

// Throws the error of an invalid UTF-8 sequence starting at `offset`.
[[noreturn]] void fail_utf8(const std::string& context, const std::string& bytes, size_t offset,
                            const char* why) {
  MIXPREC_FAIL(context, "invalid UTF-8 at byte offset ", offset, " (",
               hex_byte(static_cast<uint8_t>(bytes[offset])), "): ", why);
}

// Strict UTF-8 (RFC 3629): no overlong forms, no surrogates, nothing past U+10FFFF. An error
// gives the offset of the first byte of the sequence that is wrong; `context` starts it.
std::vector<char32_t> decode_utf8(const std::string& bytes, const std::string& context) {
  std::vector<char32_t> out;
  out.reserve(bytes.size());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t lead = static_cast<uint8_t>(bytes[i]);
    if (lead < 0x80) {
      out.push_back(lead);
      ++i;
      continue;
    }
    size_t length;
    char32_t c;
    char32_t smallest;
    if (lead >= 0xc2 && lead <= 0xdf) {
      length = 2, c = lead & 0x1f, smallest = 0x80;
    } else if (lead >= 0xe0 && lead <= 0xef) {
      length = 3, c = lead & 0x0f, smallest = 0x800;
    } else if (lead >= 0xf0 && lead <= 0xf4) {
      length = 4, c = lead & 0x07, smallest = 0x10000;
    } else if (lead <= 0xbf) {
      fail_utf8(context, bytes, i, "a continuation byte without a lead byte");
    } else {
      fail_utf8(context, bytes, i, "not a byte of UTF-8 (overlong lead byte or past U+10FFFF)");
    }
    if (i + length > n) fail_utf8(context, bytes, i, "the text ends inside a multi-byte sequence");
    for (size_t k = 1; k < length; ++k) {
      const uint8_t next = static_cast<uint8_t>(bytes[i + k]);
      if ((next & 0xc0) != 0x80) fail_utf8(context, bytes, i, "a multi-byte sequence is cut short");
      c = (c << 6) | (next & 0x3f);
    }
    if (c < smallest) fail_utf8(context, bytes, i, "overlong encoding");
    if (c >= 0xd800 && c <= 0xdfff) fail_utf8(context, bytes, i, "a UTF-16 surrogate");
    if (c > 0x10ffff) fail_utf8(context, bytes, i, "past U+10FFFF");
    out.push_back(c);
    i += length;
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xc0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3f));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xe0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (c & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (c & 0x3f));
  }
}

std::string read_text_file(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) MIXPREC_FAIL("cannot open text file '", path, "': ", std::strerror(errno));
  std::string bytes;
  char chunk[1 << 16];
  while (true) {
    const size_t got = std::fread(chunk, 1, sizeof(chunk), file);
    bytes.append(chunk, got);
    if (got < sizeof(chunk)) break;
  }
  const bool failed = std::ferror(file) != 0;
  const int error = errno;
  std::fclose(file);
  if (failed) MIXPREC_FAIL("cannot read text file '", path, "': ", std::strerror(error));
  MIXPREC_CHECK(!bytes.empty(), "text file '", path, "' is empty");
  return bytes;
}

// The code points of a file and its vocabulary (sorted distinct code points).
std::pair<std::vector<char32_t>, std::vector<char32_t>> read_characters(const std::string& path) {
  std::vector<char32_t> text = decode_utf8(read_text_file(path), "text file '" + path + "': ");
  std::vector<char32_t> chars = text;
  std::sort(chars.begin(), chars.end());
  chars.erase(std::unique(chars.begin(), chars.end()), chars.end());
  return {std::move(text), std::move(chars)};
}

int32_t rank_of(const std::vector<char32_t>& chars, char32_t c) {
  const auto it = std::lower_bound(chars.begin(), chars.end(), c);
  if (it == chars.end() || *it != c) return -1;
  return static_cast<int32_t>(it - chars.begin());
}

class CharText final : public BatchSource {
 public:
  CharText(CharTextOptions options, std::vector<int32_t> ids, int64_t vocab_size,
           int64_t train_tokens)
      : options_(std::move(options)), ids_(std::move(ids)), vocab_size_(vocab_size),
        train_tokens_(train_tokens) {}

  // Window i of batch n starts at a uniform draw from [0, train_tokens - block_size - 1]: the
  // 64-bit word of Philox counter n * batch_size + i, reduced modulo the number of starts
  // (bias below 2^-20 for any text under a terabyte). shuffle = false: window
  // w = n * batch_size + i starts at (w * block_size) mod (train_tokens - block_size).
  Batch train_batch(int64_t number) const override {
    MIXPREC_CHECK(number >= 0, "text data: training batch number must be >= 0, got ", number);
    const int64_t batch_size = options_.batch_size;
    const uint64_t starts = static_cast<uint64_t>(train_tokens_ - options_.block_size);
    std::vector<int64_t> positions(static_cast<size_t>(batch_size));
    for (int64_t i = 0; i < batch_size; ++i) {
      const uint64_t window = static_cast<uint64_t>(number) * batch_size + i;
      if (options_.shuffle) {
        const Philox4 r = philox4x32(options_.seed, window);
        const uint64_t word = (static_cast<uint64_t>(r.v[0]) << 32) | r.v[1];
        positions[i] = static_cast<int64_t>(word % starts);
      } else {
        positions[i] = static_cast<int64_t>(
            (window % starts) * (static_cast<uint64_t>(options_.block_size) % starts) % starts);
      }
    }
    return make_batch(positions, number, number / batches_per_epoch());
  }

  int64_t batches_per_epoch() const override {
    return std::max<int64_t>(1, train_tokens_ / (options_.batch_size * options_.block_size));
  }

  int64_t eval_batch_count() const override { return options_.eval_batches; }

  // Window j of the W = eval_batches * batch_size evaluation windows starts at
  // val_start + floor(j * S / W), S = validation tokens - block_size the number of starts.
  Batch eval_batch(int64_t number) const override {
    MIXPREC_CHECK(number >= 0 && number < eval_batch_count(), "text data: evaluation batch ",
                  number, " is out of range [0, ", eval_batch_count(), ")");
    const int64_t batch_size = options_.batch_size;
    const int64_t windows = options_.eval_batches * batch_size;
    const int64_t starts = static_cast<int64_t>(ids_.size()) - train_tokens_ - options_.block_size;
    std::vector<int64_t> positions(static_cast<size_t>(batch_size));
    for (int64_t i = 0; i < batch_size; ++i) {
      const int64_t j = number * batch_size + i;
      positions[i] = train_tokens_ + static_cast<int64_t>(
          static_cast<unsigned __int128>(j) * static_cast<uint64_t>(starts) /
          static_cast<uint64_t>(windows));
    }
    return make_batch(positions, number, 0);
  }

  bool is_classification() const override { return false; }
  int64_t num_classes() const override { return vocab_size_; }
  std::optional<int64_t> input_index_bound() const override { return vocab_size_; }

  std::string describe() const override {
    std::ostringstream out;
    out << "character text '" << options_.path << "': " << ids_.size() << " characters, "
        << vocab_size_ << " distinct; " << train_tokens_ << " train / "
        << static_cast<int64_t>(ids_.size()) - train_tokens_ << " validation tokens, windows of "
        << options_.block_size;
    return out.str();
  }

 private:
  Batch make_batch(const std::vector<int64_t>& positions, int64_t number, int64_t epoch) const {
    const int64_t n = static_cast<int64_t>(positions.size());
    const int64_t block = options_.block_size;
    Batch batch;
    batch.inputs = Tensor::empty({n, block}, DType::I32);
    batch.targets = Tensor::empty({n, block}, DType::I32);
    int32_t* inputs = batch.inputs.data_as<int32_t>();
    int32_t* targets = batch.targets.data_as<int32_t>();
    for (int64_t i = 0; i < n; ++i) {
      const int32_t* window = ids_.data() + positions[i];
      std::copy(window, window + block, inputs + i * block);
      std::copy(window + 1, window + block + 1, targets + i * block);
    }
    batch.number = number;
    batch.epoch = epoch;
    return batch;
  }

  CharTextOptions options_;
  std::vector<int32_t> ids_;
  int64_t vocab_size_;
  int64_t train_tokens_;  // ids_[0, train_tokens_) is the training split, the rest validation
};

}  // namespace

CharVocabulary::CharVocabulary(std::vector<char32_t> chars) : chars_(std::move(chars)) {
  for (size_t i = 0; i < chars_.size(); ++i) {
    MIXPREC_CHECK(chars_[i] <= 0x10ffff && !(chars_[i] >= 0xd800 && chars_[i] <= 0xdfff),
                  "CharVocabulary: ", code_point_name(chars_[i]), " is not a Unicode scalar value");
    MIXPREC_CHECK(i == 0 || chars_[i - 1] < chars_[i], "CharVocabulary: characters must be "
                  "sorted and distinct, got ", code_point_name(chars_[i - 1]), " before ",
                  code_point_name(chars_[i]));
  }
}

std::vector<int32_t> CharVocabulary::encode(const std::string& utf8) const {
  const std::vector<char32_t> text = decode_utf8(utf8, "CharVocabulary::encode: ");
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    ids[i] = rank_of(chars_, text[i]);
    if (ids[i] >= 0) continue;
    // The character itself when it prints, so that the user sees which one it is.
    std::string shown;
    if (text[i] >= 0x20 && text[i] != 0x7f) {
      shown = "'";
      append_utf8(shown, text[i]);
      shown += "' (" + code_point_name(text[i]) + ")";
    } else {
      shown = code_point_name(text[i]);
    }
    MIXPREC_FAIL("CharVocabulary::encode: character ", shown, " at position ", i,
                 " is not in the vocabulary of ", chars_.size(), " characters");
  }
  return ids;
}

std::string CharVocabulary::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    MIXPREC_CHECK(ids[i] >= 0 && ids[i] < size(), "CharVocabulary::decode: id ", ids[i],
                  " at position ", i, " is out of range [0, ", size(), ")");
    append_utf8(out, chars_[static_cast<size_t>(ids[i])]);
  }
  return out;
}

std::unique_ptr<BatchSource> load_char_text(const CharTextOptions& options) {
  MIXPREC_CHECK(options.val_fraction > 0.0 && options.val_fraction < 1.0, "text data '",
                options.path, "': val_fraction must be in (0, 1), got ", options.val_fraction);
  MIXPREC_CHECK(options.block_size >= 1, "text data '", options.path,
                "': block_size must be >= 1, got ", options.block_size);
  MIXPREC_CHECK(options.batch_size >= 1, "text data '", options.path,
                "': batch_size must be >= 1, got ", options.batch_size);
  MIXPREC_CHECK(options.eval_batches >= 1, "text data '", options.path,
                "': eval_batches must be >= 1, got ", options.eval_batches);
  auto [text, chars] = read_characters(options.path);
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = rank_of(chars, text[i]);

  // As nanoGPT's prepare.py: train = data[:int(n * (1 - val_fraction))].
  const int64_t total = static_cast<int64_t>(ids.size());
  const int64_t train_tokens =
      static_cast<int64_t>(static_cast<double>(total) * (1.0 - options.val_fraction));
  const int64_t val_tokens = total - train_tokens;
  const int64_t needed = options.block_size + 1;
  MIXPREC_CHECK(train_tokens >= needed, "text data '", options.path, "': training split has ",
                train_tokens, " tokens, block_size + 1 = ", needed, " needed");
  MIXPREC_CHECK(val_tokens >= needed, "text data '", options.path, "': validation split has ",
                val_tokens, " tokens, block_size + 1 = ", needed, " needed");
  return std::make_unique<CharText>(options, std::move(ids), static_cast<int64_t>(chars.size()),
                                    train_tokens);
}

CharVocabulary char_vocabulary_of(const std::string& path) {
  return CharVocabulary(read_characters(path).second);
}

}  // namespace mixprec
