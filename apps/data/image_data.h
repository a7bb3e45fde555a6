// Image classification data from IDX files: train and test splits, pixels scaled to [0, 1]
// then optionally normalised ((x - mean) / std), labels checked against num_classes.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "apps/data/batch.h"

namespace mixprec {

struct ImageDataOptions {
  std::string train_images, train_labels, test_images, test_labels;  // paths
  int64_t num_classes = 10;
  std::optional<double> mean, std;  // both or neither; std > 0
  int64_t batch_size = 128;
  bool shuffle = true;  // false: file order, epoch after epoch
  uint64_t seed = 0;
  int64_t limit_train = 0;  // > 0: use only the first N training examples (tests, demos)
  int64_t limit_test = 0;   // > 0: only the first N test examples
};

// Reads all four files eagerly. Throws mixprec::Error naming the file for every problem
// read_idx_* reports, plus: images and labels of a split differing in count, a label >=
// num_classes ("label 12 at index 345 is out of range [0, 10)"), batch_size < 1 or larger
// than the training set, only one of mean/std given, std <= 0.
// Shuffling: epoch e's order is a Fisher-Yates permutation drawn from Philox(seed, e), so
// batch n is example order[e][(n mod B) * batch_size ...] with e = n / B.
std::unique_ptr<BatchSource> load_image_data(const ImageDataOptions& options);

}  // namespace mixprec
