// Character-level text data: any UTF-8 or ASCII file. The vocabulary is the sorted set of
// distinct characters (Unicode code points, decoded from UTF-8); ids are their ranks. The
// first (1 - val_fraction) of the text is the training split, the rest the validation split
// (contiguous, like nanoGPT's prepare.py).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "apps/data/batch.h"

namespace mixprec {

struct CharTextOptions {
  std::string path;
  double val_fraction = 0.1;  // in (0, 1)
  int64_t block_size = 128;
  int64_t batch_size = 32;
  uint64_t seed = 0;
  // false (for tests): window w = n * batch_size + i (window i of batch n) starts at
  // (w * block_size) mod (train tokens - block_size), walking the training split and wrapping.
  bool shuffle = true;
  int64_t eval_batches = 20;  // windows in the fixed evaluation set = eval_batches * batch_size
};

class CharVocabulary {
 public:
  explicit CharVocabulary(std::vector<char32_t> chars);  // sorted, distinct
  int64_t size() const { return static_cast<int64_t>(chars_.size()); }
  const std::vector<char32_t>& chars() const { return chars_; }
  std::vector<int32_t> encode(const std::string& utf8) const;  // throws on unknown characters
  std::string decode(const std::vector<int32_t>& ids) const;

 private:
  std::vector<char32_t> chars_;
};

// Training batches: batch_size random windows of block_size + 1 tokens from the training
// split (start positions drawn from Philox(seed, batch number)), inputs = first block_size,
// targets = the same shifted by one. Window i of batch n starts uniformly in
// [0, train tokens - block_size - 1], drawn from Philox counter n * batch_size + i. Training
// split = the first int(tokens * (1 - val_fraction)) tokens. Evaluation: a fixed set of
// windows spread evenly over the validation split: of the W = eval_batches * batch_size
// windows, window j (window i of eval batch m, j = m * batch_size + i) starts at
// floor(j * S / W) into the split, S = validation tokens - block_size.
// Throws mixprec::Error naming the path for: a missing or unreadable file, an empty file,
// invalid UTF-8 (with the byte offset), a split shorter than block_size + 1 tokens
// ("validation split has 50 tokens, block_size + 1 = 129 needed"), val_fraction outside
// (0, 1), block_size, batch_size or eval_batches < 1.
std::unique_ptr<BatchSource> load_char_text(const CharTextOptions& options);

// The vocabulary of a file, for sampling and for taking vocab_size from the data.
CharVocabulary char_vocabulary_of(const std::string& path);

}  // namespace mixprec
