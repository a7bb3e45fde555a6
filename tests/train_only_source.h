// A BatchSource for tests that only hand out training batches: a derived class writes
// train_batch; the epoch length, the kind of task and the description are given at
// construction, and there are no evaluation batches (eval_batch throws). Inputs are not
// indices (input_index_bound is nullopt).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "apps/data/batch.h"
#include "core/error.h"

namespace mixprec_test {

class TrainOnlySource : public mixprec::BatchSource {
 public:
  TrainOnlySource(int64_t batches_per_epoch, bool classification, int64_t classes,
                  std::string description)
      : batches_per_epoch_(batches_per_epoch),
        classification_(classification),
        classes_(classes),
        description_(std::move(description)) {}

  int64_t batches_per_epoch() const override { return batches_per_epoch_; }
  int64_t eval_batch_count() const override { return 0; }
  mixprec::Batch eval_batch(int64_t) const override {
    throw mixprec::Error("no evaluation batches");
  }
  bool is_classification() const override { return classification_; }
  int64_t num_classes() const override { return classes_; }
  std::optional<int64_t> input_index_bound() const override { return std::nullopt; }
  std::string describe() const override { return description_; }

 private:
  int64_t batches_per_epoch_;
  bool classification_;
  int64_t classes_;
  std::string description_;
};

}  // namespace mixprec_test
