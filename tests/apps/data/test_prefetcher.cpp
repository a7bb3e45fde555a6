// Prefetcher: the batches it hands out are exactly train_batch(first), train_batch(first + 1),
// ...; an exception thrown for a number comes out of next() for that number.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "apps/data/char_text.h"
#include "apps/data/image_data.h"
#include "apps/data/prefetcher.h"
#include "core/error.h"
#include "data_test_files.h"

using namespace mixprec;
using data_test::TempDir;

namespace {

// A source whose batch n holds n, records what it was asked for, and fails for one number.
class CountingSource final : public BatchSource {
 public:
  explicit CountingSource(int64_t fail_at = -1, int delay_ms = 0)
      : fail_at_(fail_at), delay_ms_(delay_ms) {}

  Batch train_batch(int64_t number) const override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      asked_.push_back(number);
    }
    if (delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
    if (number == fail_at_) throw Error("batch " + std::to_string(number) + " cannot be built");
    Batch batch;
    batch.inputs = Tensor::from_ints({static_cast<int32_t>(number)}, {1});
    batch.targets = Tensor::from_ints({static_cast<int32_t>(2 * number)}, {1});
    batch.number = number;
    batch.epoch = number / 10;
    return batch;
  }
  int64_t batches_per_epoch() const override { return 10; }
  int64_t eval_batch_count() const override { return 0; }
  Batch eval_batch(int64_t) const override { throw Error("no evaluation batches"); }
  bool is_classification() const override { return false; }
  int64_t num_classes() const override { return 1; }
  std::string describe() const override { return "counting"; }

  std::vector<int64_t> asked() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return asked_;
  }

 private:
  int64_t fail_at_;
  int delay_ms_;
  mutable std::mutex mutex_;
  mutable std::vector<int64_t> asked_;
};

void check_same_batch(const Batch& a, const Batch& b) {
  REQUIRE(a.inputs.shape() == b.inputs.shape());
  REQUIRE(a.inputs.dtype() == b.inputs.dtype());
  if (a.inputs.dtype() == DType::I32) {
    CHECK(a.inputs.to_int_vector() == b.inputs.to_int_vector());
  } else {
    CHECK(a.inputs.to_float_vector() == b.inputs.to_float_vector());
  }
  CHECK(a.targets.to_int_vector() == b.targets.to_int_vector());
  CHECK(a.number == b.number);
  CHECK(a.epoch == b.epoch);
}

}  // namespace

TEST_CASE("Prefetcher returns exactly train_batch(n) of char text, in order", "[data][prefetch]") {
  TempDir dir;
  CharTextOptions o;
  o.path = dir.file("text.txt");
  std::string text;
  for (int i = 0; i < 2000; ++i) text += static_cast<char>('a' + (i * i + 3 * i) % 26);
  data_test::write_text(o.path, text);
  o.block_size = 16;
  o.batch_size = 4;
  o.seed = 99;
  const auto data = load_char_text(o);
  for (int64_t first : {0, 17}) {
    INFO("first " << first);
    Prefetcher prefetcher(*data, first);
    for (int64_t n = first; n < first + 30; ++n) {
      const Batch batch = prefetcher.next();
      CHECK(batch.number == n);
      check_same_batch(batch, data->train_batch(n));
    }
  }
}

TEST_CASE("Prefetcher returns exactly train_batch(n) of shuffled images across epochs",
          "[data][prefetch]") {
  TempDir dir;
  std::vector<uint8_t> pixels, labels;
  for (int e = 0; e < 20; ++e) {
    for (int k = 0; k < 4; ++k) pixels.push_back(static_cast<uint8_t>(12 * e + k));
    labels.push_back(static_cast<uint8_t>(e % 10));
  }
  ImageDataOptions o;
  o.train_images = o.test_images = dir.file("images");
  o.train_labels = o.test_labels = dir.file("labels");
  data_test::write_bytes(o.train_images, data_test::idx_images(20, 2, 2, pixels));
  data_test::write_bytes(o.train_labels, data_test::idx_labels(labels));
  o.batch_size = 6;  // 3 batches per epoch
  o.seed = 4;
  const auto data = load_image_data(o);
  Prefetcher prefetcher(*data, 0);
  for (int64_t n = 0; n < 12; ++n) check_same_batch(prefetcher.next(), data->train_batch(n));
}

TEST_CASE("Prefetcher builds one batch ahead, in order, without skipping", "[data][prefetch]") {
  CountingSource source;
  Prefetcher prefetcher(source, 5);
  for (int64_t n = 5; n < 15; ++n) {
    const Batch batch = prefetcher.next();
    CHECK(batch.number == n);
    CHECK(batch.inputs.to_int_vector() == std::vector<int32_t>{static_cast<int32_t>(n)});
    CHECK(batch.targets.to_int_vector() == std::vector<int32_t>{static_cast<int32_t>(2 * n)});
    const std::vector<int64_t> asked = source.asked();
    // Batches 5..n were taken; the worker may already be on n + 1, never further.
    REQUIRE(asked.size() >= static_cast<size_t>(n - 4));
    REQUIRE(asked.size() <= static_cast<size_t>(n - 3));
    for (size_t k = 0; k < asked.size(); ++k) CHECK(asked[k] == 5 + static_cast<int64_t>(k));
  }
}

TEST_CASE("Prefetcher rethrows the exception of the batch that failed", "[data][prefetch]") {
  CountingSource source(3);
  Prefetcher prefetcher(source, 0);
  for (int64_t n = 0; n < 3; ++n) CHECK(prefetcher.next().number == n);
  CHECK_THROWS_WITH(prefetcher.next(), "batch 3 cannot be built");
  // The failure stays: the same error again, and nothing later is built.
  CHECK_THROWS_WITH(prefetcher.next(), "batch 3 cannot be built");
  const std::vector<int64_t> asked = source.asked();
  CHECK(asked == std::vector<int64_t>{0, 1, 2, 3});
}

TEST_CASE("Prefetcher can be destroyed while a batch is being built", "[data][prefetch]") {
  CountingSource source(-1, 30);
  {
    Prefetcher prefetcher(source, 0);
  }
  {
    Prefetcher prefetcher(source, 0);
    CHECK(prefetcher.next().number == 0);
  }
  // Neither prefetcher asked for more than one batch past what was taken.
  CHECK(source.asked().size() <= 3);
}
