// Prefetcher: the batches it hands out are exactly train_batch(first), train_batch(first + 1),
// ...; an exception thrown for a number comes out of next() for that number. Each carries the
// scan of its inputs for Inf/NaN (scan_inputs, tested here on its own too). Handing batches
// out on a GPU is tested in tests/cuda/test_cuda_prefetch_upload.cpp.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "apps/data/char_text.h"
#include "apps/data/image_data.h"
#include "apps/data/input_scan.h"
#include "apps/data/prefetcher.h"
#include "core/backend.h"
#include "core/error.h"
#include "data_test_files.h"
#include "tests/tensor_bytes.h"
#include "tests/train_only_source.h"

using namespace mixprec;
using data_test::TempDir;

namespace {

// A source whose batch n holds n, records what it was asked for, and fails for one number.
class CountingSource final : public mixprec_test::TrainOnlySource {
 public:
  explicit CountingSource(int64_t fail_at = -1, int delay_ms = 0)
      : TrainOnlySource(10, false, 1, "counting"), fail_at_(fail_at), delay_ms_(delay_ms) {}

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

// A source of F32 images [2, 3, 4, 4] (96 values, 0.25 * i + number) where batch n, for odd
// n < 13, holds a non-finite value at element 7 * n (NaN, Inf or -Inf by n mod 3), and, for
// n == 7, another one later at element 90; even batches are finite. Batch `undefined_at` has
// no inputs at all, so scanning it fails.
class FloatSource final : public mixprec_test::TrainOnlySource {
 public:
  explicit FloatSource(int64_t undefined_at = -1)
      : TrainOnlySource(100, true, 2, "floats"), undefined_at_(undefined_at) {}

  static int64_t bad_element(int64_t number) {
    return number % 2 == 1 && number < 13 ? 7 * number : -1;
  }
  static double bad_value(int64_t number) {
    switch (number % 3) {
      case 0: return std::numeric_limits<double>::quiet_NaN();
      case 1: return std::numeric_limits<double>::infinity();
      default: return -std::numeric_limits<double>::infinity();
    }
  }

  Batch train_batch(int64_t number) const override {
    Batch batch;
    batch.number = number;
    batch.targets = Tensor::from_ints({1, 0}, {2});
    if (number == undefined_at_) return batch;
    std::vector<float> values(96);
    for (size_t i = 0; i < values.size(); ++i) values[i] = 0.25f * i + number;
    const int64_t bad = bad_element(number);
    if (bad >= 0) values[static_cast<size_t>(bad)] = static_cast<float>(bad_value(number));
    if (number == 7) values[90] = std::numeric_limits<float>::infinity();
    batch.inputs = Tensor::from_vector(values, {2, 3, 4, 4});
    return batch;
  }

 private:
  int64_t undefined_at_;
};

// The same kind of non-finite value: NaN for NaN, else equal (Inf keeps its sign).
bool same_kind(double a, double b) { return std::isnan(a) ? std::isnan(b) : a == b; }

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

TEST_CASE("scan_inputs finds the first non-finite value of every floating dtype",
          "[data][prefetch][input_scan]") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Finite, including the extremes: a subnormal and the largest finite values.
  std::vector<float> values(40000, 1.5f);
  values[3] = std::numeric_limits<float>::denorm_min();
  values[4] = std::numeric_limits<float>::max();
  values[5] = -std::numeric_limits<float>::max();
  CHECK(scan_inputs(Tensor::from_vector(values, {40000})).element == -1);
  // F32 is searched in blocks of 16384: the last element of the first block, the first of
  // the second, and the earliest of several.
  for (int64_t at : {int64_t{0}, int64_t{16383}, int64_t{16384}, int64_t{39999}}) {
    INFO("element " << at);
    std::vector<float> bad = values;
    bad[at] = -inf;
    if (at + 100 < 40000) bad[at + 100] = nan;
    const InputScan scan = scan_inputs(Tensor::from_vector(bad, {200, 200}));
    CHECK(scan.element == at);
    CHECK(scan.value == -std::numeric_limits<double>::infinity());
  }
  // F16 and BF16 keep Inf and NaN through the scan's float copy.
  for (DType dtype : {DType::F16, DType::BF16}) {
    INFO(dtype_name(dtype));
    const InputScan nan_scan = scan_inputs(Tensor::from_vector({1.f, 2.f, nan, inf}, {4}, dtype));
    CHECK(nan_scan.element == 2);
    CHECK(std::isnan(nan_scan.value));
    const InputScan inf_scan = scan_inputs(Tensor::from_vector({1.f, inf, nan}, {3}, dtype));
    CHECK(inf_scan.element == 1);
    CHECK(inf_scan.value == std::numeric_limits<double>::infinity());
    CHECK(scan_inputs(Tensor::from_vector({1.f, -2.f}, {2}, dtype)).element == -1);
  }
  // Token ids cannot hold Inf or NaN: not read, element -1 (the bits of 0x7F800000, an F32
  // Inf, are an ordinary integer here).
  CHECK(scan_inputs(Tensor::from_ints({0x7F800000, -1}, {2})).element == -1);
  CHECK_THROWS_WITH(scan_inputs(Tensor()), Catch::Contains("undefined"));
}

namespace {

// Two characters' worth of text in windows of 8, two to a batch.
std::unique_ptr<BatchSource> small_char_text(const TempDir& dir) {
  CharTextOptions o;
  o.path = dir.file("text.txt");
  data_test::write_text(o.path, std::string(500, 'x') + std::string(500, 'y'));
  o.block_size = 8;
  o.batch_size = 2;
  return load_char_text(o);
}

// The first `count` prefetched batches of `data` come with a scan that found nothing.
void expect_finite_scans(const BatchSource& data, int64_t count) {
  Prefetcher prefetcher(data, 0);
  for (int64_t n = 0; n < count; ++n) {
    const Batch batch = prefetcher.next();
    REQUIRE(batch.input_scan.has_value());
    CHECK(batch.input_scan->element == -1);
  }
}

}  // namespace

TEST_CASE("Prefetcher batches carry the scan of their inputs", "[data][prefetch][input_scan]") {
  SECTION("floating inputs, some with Inf or NaN") {
    const FloatSource source;
    Prefetcher prefetcher(source, 3);
    for (int64_t n = 3; n < 12; ++n) {
      INFO("batch " << n);
      const Batch batch = prefetcher.next();
      REQUIRE(batch.number == n);
      REQUIRE(batch.input_scan.has_value());
      CHECK(batch.input_scan->element == FloatSource::bad_element(n));
      if (FloatSource::bad_element(n) >= 0) {
        CHECK(same_kind(batch.input_scan->value, FloatSource::bad_value(n)));
      }
      // Bit for bit (NaN is not equal to itself).
      const Batch expected = source.train_batch(n);
      CHECK(mixprec_test::raw_bytes(batch.inputs) == mixprec_test::raw_bytes(expected.inputs));
      CHECK(batch.targets.to_int_vector() == expected.targets.to_int_vector());
      CHECK(batch.inputs.device().is_cpu());
    }
  }
  SECTION("images, all finite") {
    TempDir dir;
    std::vector<uint8_t> pixels, labels;
    for (int e = 0; e < 12; ++e) {
      for (int k = 0; k < 9; ++k) pixels.push_back(static_cast<uint8_t>(21 * e + 5 * k));
      labels.push_back(static_cast<uint8_t>(e % 10));
    }
    ImageDataOptions o;
    o.train_images = o.test_images = dir.file("images");
    o.train_labels = o.test_labels = dir.file("labels");
    data_test::write_bytes(o.train_images, data_test::idx_images(12, 3, 3, pixels));
    data_test::write_bytes(o.train_labels, data_test::idx_labels(labels));
    o.mean = 0.5;
    o.std = 0.25;
    o.batch_size = 4;
    const auto data = load_image_data(o);
    expect_finite_scans(*data, 5);
  }
  SECTION("token ids") {
    TempDir dir;
    const auto data = small_char_text(dir);
    expect_finite_scans(*data, 3);
  }
}

TEST_CASE("Prefetcher rethrows a failed scan or upload for the batch it belongs to",
          "[data][prefetch][input_scan]") {
  SECTION("scan: batch 2 has no inputs") {
    const FloatSource source(2);
    Prefetcher prefetcher(source, 0);
    CHECK(prefetcher.next().number == 0);
    CHECK(prefetcher.next().number == 1);
    CHECK_THROWS_WITH(prefetcher.next(), Catch::Contains("the tensor is undefined"));
    CHECK_THROWS_WITH(prefetcher.next(), Catch::Contains("the tensor is undefined"));
  }
  SECTION("upload: a device this build has no backend for") {
    if (has_backend(DeviceType::CUDA)) {
      WARN("skipped: a CUDA backend is registered in this test program");
      return;
    }
    const FloatSource source;
    Prefetcher prefetcher(source, 4, cuda_device(0));
    CHECK_THROWS_WITH(prefetcher.next(), Catch::Contains("no backend for device cuda:0"));
  }
}

TEST_CASE("Prefetcher casts floating inputs to the input dtype after scanning them",
          "[data][prefetch][input_scan]") {
  for (DType dtype : {DType::F16, DType::BF16}) {
    INFO(dtype_name(dtype));
    const FloatSource source;
    Prefetcher prefetcher(source, 3, kCPU, dtype);
    for (int64_t n = 3; n < 10; ++n) {
      INFO("batch " << n);
      const Batch batch = prefetcher.next();
      const Batch expected = source.train_batch(n);
      REQUIRE(batch.inputs.dtype() == dtype);
      // The CPU backend's cast, bit for bit (Inf and NaN included).
      CHECK(mixprec_test::raw_bytes(batch.inputs) ==
            mixprec_test::raw_bytes(expected.inputs.to(dtype)));
      // Scanned before the cast: the F32 values' findings.
      REQUIRE(batch.input_scan.has_value());
      CHECK(batch.input_scan->element == FloatSource::bad_element(n));
      CHECK(batch.targets.to_int_vector() == expected.targets.to_int_vector());
    }
  }
  SECTION("token ids stay I32") {
    TempDir dir;
    const auto data = small_char_text(dir);
    Prefetcher prefetcher(*data, 0, kCPU, DType::F16);
    const Batch batch = prefetcher.next();
    CHECK(batch.inputs.dtype() == DType::I32);
    check_same_batch(batch, data->train_batch(0));
  }
  SECTION("an input dtype that is not floating is refused before the worker starts") {
    const FloatSource source;
    CHECK_THROWS_WITH(Prefetcher(source, 0, kCPU, DType::I32),
                      Catch::Contains("the input dtype must be F32, F16 or BF16, got I32"));
  }
}
