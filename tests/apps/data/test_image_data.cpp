// Image data: small IDX sets whose pixels name their example, so that every batch can be
// checked against the file; plus the real MNIST and Fashion-MNIST files when present.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <omp.h>

#include "apps/data/image_data.h"
#include "core/error.h"
#include "data_test_files.h"
#include "tests/tensor_bytes.h"

using namespace mixprec;
using data_test::TempDir;
using mixprec_test::raw_bytes;

namespace {

constexpr int kRows = 2, kCols = 3;

// Pixel k of example e: 20 * e + k (e < 12), so pixel 0 / 20 gives the example back.
uint8_t pixel_of(int example, int k) { return static_cast<uint8_t>(20 * example + k); }
uint8_t label_of(int example, int classes) { return static_cast<uint8_t>((example * 3) % classes); }

// Writes `count` examples (gzip images, raw labels) and returns the two paths.
std::pair<std::string, std::string> write_split(const TempDir& dir, const std::string& name,
                                                int count, int classes) {
  std::vector<uint8_t> pixels, labels;
  for (int e = 0; e < count; ++e) {
    for (int k = 0; k < kRows * kCols; ++k) pixels.push_back(pixel_of(e, k));
    labels.push_back(label_of(e, classes));
  }
  const std::string images_path = dir.file(name + "-images-idx3-ubyte.gz");
  const std::string labels_path = dir.file(name + "-labels-idx1-ubyte");
  data_test::write_bytes(images_path, data_test::gzip_bytes(data_test::idx_images(
                                          static_cast<uint32_t>(count), kRows, kCols, pixels)));
  data_test::write_bytes(labels_path, data_test::idx_labels(labels));
  return {images_path, labels_path};
}

ImageDataOptions small_options(const TempDir& dir, int train_count, int test_count,
                               int classes = 4) {
  ImageDataOptions o;
  std::tie(o.train_images, o.train_labels) = write_split(dir, "train", train_count, classes);
  std::tie(o.test_images, o.test_labels) = write_split(dir, "test", test_count, classes);
  o.num_classes = classes;
  o.batch_size = 3;
  return o;
}

// The example each row of an unnormalised batch holds, read back from its first pixel.
std::vector<int> examples_of(const Batch& batch) {
  std::vector<int> out;
  const std::vector<float> x = batch.inputs.to_float_vector();
  for (int64_t i = 0; i < batch.inputs.size(0); ++i) {
    out.push_back(static_cast<int>(std::lround(x[i * kRows * kCols] * 255.f)) / 20);
  }
  return out;
}

// Checks every value of `batch` against examples `examples` of the file:
// x = (p / 255 - mean) / std, label = label_of(example).
void check_batch_holds(const Batch& batch, const std::vector<int>& examples, int classes,
                       double mean = 0.0, double stddev = 1.0) {
  const int64_t n = static_cast<int64_t>(examples.size());
  REQUIRE(batch.inputs.shape() == Shape{n, 1, kRows, kCols});
  REQUIRE(batch.inputs.dtype() == DType::F32);
  REQUIRE(batch.targets.shape() == Shape{n});
  REQUIRE(batch.targets.dtype() == DType::I32);
  const std::vector<float> x = batch.inputs.to_float_vector();
  const std::vector<int32_t> y = batch.targets.to_int_vector();
  for (int64_t i = 0; i < n; ++i) {
    for (int k = 0; k < kRows * kCols; ++k) {
      const double expected = (pixel_of(examples[i], k) / 255.0 - mean) / stddev;
      REQUIRE(x[i * kRows * kCols + k] == Approx(expected).epsilon(1e-6).margin(1e-7));
    }
    REQUIRE(y[i] == label_of(examples[i], classes));
  }
}

// The examples of one epoch, in the order its batches give them.
std::vector<int> epoch_examples(const BatchSource& data, int64_t epoch) {
  std::vector<int> out;
  const int64_t per_epoch = data.batches_per_epoch();
  for (int64_t n = epoch * per_epoch; n < (epoch + 1) * per_epoch; ++n) {
    const std::vector<int> part = examples_of(data.train_batch(n));
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

bool same_batch(const Batch& a, const Batch& b) {
  return a.inputs.shape() == b.inputs.shape() &&
         a.inputs.to_float_vector() == b.inputs.to_float_vector() &&
         a.targets.to_int_vector() == b.targets.to_int_vector() && a.number == b.number &&
         a.epoch == b.epoch;
}

}  // namespace

TEST_CASE("image data without shuffling gives the file order, epoch after epoch",
          "[data][images]") {
  TempDir dir;
  ImageDataOptions o = small_options(dir, 10, 7);
  o.shuffle = false;
  const auto data = load_image_data(o);
  // 10 examples in batches of 3: three batches, example 9 dropped.
  REQUIRE(data->batches_per_epoch() == 3);
  CHECK(data->is_classification());
  CHECK(data->num_classes() == 4);
  CHECK_FALSE(data->input_index_bound().has_value());
  for (int64_t n = 0; n < 7; ++n) {
    INFO("batch " << n);
    const Batch batch = data->train_batch(n);
    CHECK(batch.number == n);
    CHECK(batch.epoch == n / 3);
    const int first = static_cast<int>(n % 3) * 3;
    check_batch_holds(batch, {first, first + 1, first + 2}, 4);
  }
  // Pixel values are exactly p / 255 in FP32.
  const Batch batch = data->train_batch(1);
  CHECK(batch.inputs.get(0) == static_cast<float>(pixel_of(3, 0)) / 255.f);
  CHECK(batch.inputs.get(17) == static_cast<float>(pixel_of(5, 5)) / 255.f);
}

TEST_CASE("image data normalises as (p / 255 - mean) / std", "[data][images]") {
  TempDir dir;
  ImageDataOptions o = small_options(dir, 10, 7);
  o.shuffle = false;
  o.mean = 0.2860;
  o.std = 0.3530;
  const auto data = load_image_data(o);
  check_batch_holds(data->train_batch(2), {6, 7, 8}, 4, 0.2860, 0.3530);
  check_batch_holds(data->eval_batch(2), {6}, 4, 0.2860, 0.3530);
  // Pixel 0 of example 0 is 0: -mean / std.
  CHECK(data->train_batch(0).inputs.get(0) == Approx(-0.2860 / 0.3530).epsilon(1e-6));
}

TEST_CASE("image data evaluation covers the whole test set in order", "[data][images]") {
  TempDir dir;
  ImageDataOptions o = small_options(dir, 10, 7);
  o.seed = 5;
  const auto data = load_image_data(o);
  o.seed = 6;
  const auto other_seed = load_image_data(o);
  // 7 test examples in batches of 3: 3, 3, 1.
  REQUIRE(data->eval_batch_count() == 3);
  check_batch_holds(data->eval_batch(0), {0, 1, 2}, 4);
  check_batch_holds(data->eval_batch(1), {3, 4, 5}, 4);
  check_batch_holds(data->eval_batch(2), {6}, 4);
  CHECK(data->eval_batch(2).number == 2);
  for (int64_t m = 0; m < 3; ++m) CHECK(same_batch(data->eval_batch(m), other_seed->eval_batch(m)));
  CHECK_THROWS_WITH(data->eval_batch(3), Catch::Contains("evaluation batch 3 is out of range"));
  CHECK_THROWS_AS(data->eval_batch(-1), Error);
  CHECK_THROWS_AS(data->train_batch(-1), Error);
}

TEST_CASE("image data shuffling: a permutation per epoch, different per epoch and per seed, "
          "the same for the same seed",
          "[data][images]") {
  TempDir dir;
  ImageDataOptions o = small_options(dir, 12, 4);
  o.seed = 11;
  const auto data = load_image_data(o);
  REQUIRE(data->batches_per_epoch() == 4);

  std::vector<int> sorted(12);
  for (int i = 0; i < 12; ++i) sorted[i] = i;
  std::vector<std::vector<int>> epochs;
  for (int64_t e = 0; e < 3; ++e) {
    std::vector<int> order = epoch_examples(*data, e);
    std::vector<int> check = order;
    std::sort(check.begin(), check.end());
    CHECK(check == sorted);  // every example exactly once
    CHECK(order != sorted);
    epochs.push_back(order);
  }
  CHECK(epochs[0] != epochs[1]);
  CHECK(epochs[1] != epochs[2]);

  // Batches hold what their examples hold, with the epoch recorded.
  for (int64_t n : {0, 5, 11}) {
    const Batch batch = data->train_batch(n);
    CHECK(batch.epoch == n / 4);
    check_batch_holds(batch, examples_of(batch), 4);
  }

  o.seed = 12;
  const auto other_seed = load_image_data(o);
  CHECK(epoch_examples(*other_seed, 0) != epochs[0]);

  // A fresh source with the same seed, asked out of order, gives the same batches.
  o.seed = 11;
  const auto again = load_image_data(o);
  for (int64_t n : {9, 2, 10, 0, 7}) CHECK(same_batch(again->train_batch(n), data->train_batch(n)));
}

TEST_CASE("image data shuffling puts every example first about equally often",
          "[data][images]") {
  TempDir dir;
  ImageDataOptions o = small_options(dir, 12, 4);
  o.batch_size = 12;  // one batch per epoch: batch n is epoch n's whole order
  const auto data = load_image_data(o);
  std::vector<int> first(12, 0), last(12, 0);
  const int epochs = 1200;
  for (int64_t e = 0; e < epochs; ++e) {
    const std::vector<int> order = examples_of(data->train_batch(e));
    ++first[order.front()];
    ++last[order.back()];
  }
  // Binomial(1200, 1/12): mean 100, standard deviation 9.6; the bounds are 4.7 of them.
  for (int k = 0; k < 12; ++k) {
    INFO("example " << k);
    CHECK(first[k] > 55);
    CHECK(first[k] < 145);
    CHECK(last[k] > 55);
    CHECK(last[k] < 145);
  }
}

TEST_CASE("image data train_batch is safe to call from several threads", "[data][images]") {
  TempDir dir;
  ImageDataOptions o = small_options(dir, 12, 4);
  o.seed = 3;
  const auto data = load_image_data(o);
  std::vector<Batch> serial;
  for (int64_t n = 0; n < 40; ++n) serial.push_back(data->train_batch(n));
  // Each thread walks the numbers from its own start, so epochs change under each other.
  std::vector<std::vector<Batch>> results(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int64_t k = 0; k < 40; ++k) results[t].push_back(data->train_batch((k + 7 * t) % 40));
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < 4; ++t) {
    for (int64_t k = 0; k < 40; ++k) CHECK(same_batch(results[t][k], serial[(k + 7 * t) % 40]));
  }
}

TEST_CASE("image data limits, sizes and describe()", "[data][images]") {
  TempDir dir;
  ImageDataOptions o = small_options(dir, 12, 7);
  o.limit_train = 8;
  o.limit_test = 5;
  o.batch_size = 2;
  o.shuffle = false;
  const auto data = load_image_data(o);
  CHECK(data->batches_per_epoch() == 4);
  CHECK(data->eval_batch_count() == 3);
  check_batch_holds(data->eval_batch(2), {4}, 4);
  check_batch_holds(data->train_batch(3), {6, 7}, 4);
  check_batch_holds(data->train_batch(4), {0, 1}, 4);  // example 8 is past the limit
  CHECK(data->describe() == "Fashion-MNIST-style IDX: 8 train / 5 test images 2x3, 4 classes");
  // A limit past the end keeps everything.
  o.limit_train = 100;
  CHECK(load_image_data(o)->batches_per_epoch() == 6);
}

TEST_CASE("image data errors name the file and the value", "[data][images]") {
  TempDir dir;
  const ImageDataOptions good = small_options(dir, 10, 7, 10);
  REQUIRE_NOTHROW(load_image_data(good));

  SECTION("images and labels differing in count") {
    ImageDataOptions o = good;
    o.test_labels = good.train_labels;  // 10 labels for 7 test images
    CHECK_THROWS_WITH(load_image_data(o),
                      Catch::Contains(good.test_images) && Catch::Contains(good.train_labels) &&
                          Catch::Contains("7 images") && Catch::Contains("10 labels"));
  }
  SECTION("a label out of range") {
    ImageDataOptions o = good;
    o.train_labels = dir.file("bad-labels");
    data_test::write_bytes(o.train_labels,
                           data_test::idx_labels({0, 1, 2, 12, 4, 5, 6, 7, 8, 9}));
    CHECK_THROWS_WITH(load_image_data(o),
                      Catch::Contains(o.train_labels) &&
                          Catch::Contains("label 12 at index 3 is out of range [0, 10)"));
    // The same file is fine with 13 classes.
    o.num_classes = 13;
    CHECK_NOTHROW(load_image_data(o));
  }
  SECTION("a missing or corrupt file") {
    ImageDataOptions o = good;
    o.test_labels = dir.file("absent");
    CHECK_THROWS_WITH(load_image_data(o), Catch::Contains(o.test_labels));
    o = good;
    o.train_images = good.train_labels;
    CHECK_THROWS_WITH(load_image_data(o),
                      Catch::Contains(good.train_labels) && Catch::Contains("wrong magic"));
  }
  SECTION("test images of another size") {
    ImageDataOptions o = good;
    o.test_images = dir.file("other-size");
    data_test::write_bytes(o.test_images,
                           data_test::idx_images(7, 3, 2, std::vector<uint8_t>(42, 0)));
    CHECK_THROWS_WITH(load_image_data(o),
                      Catch::Contains(o.test_images) && Catch::Contains("3x2") &&
                          Catch::Contains("2x3"));
  }
  SECTION("batch_size") {
    ImageDataOptions o = good;
    o.batch_size = 0;
    CHECK_THROWS_WITH(load_image_data(o), Catch::Contains("batch_size must be >= 1, got 0"));
    o.batch_size = 11;
    CHECK_THROWS_WITH(load_image_data(o),
                      Catch::Contains("batch_size 11 is larger than the training split") &&
                          Catch::Contains("10 examples"));
    o.batch_size = 10;
    CHECK(load_image_data(o)->batches_per_epoch() == 1);
  }
  SECTION("mean and std") {
    ImageDataOptions o = good;
    o.mean = 0.5;
    CHECK_THROWS_WITH(load_image_data(o), Catch::Contains("both mean and std"));
    o.mean.reset();
    o.std = 0.5;
    CHECK_THROWS_WITH(load_image_data(o), Catch::Contains("both mean and std"));
    o.mean = 0.5;
    o.std = 0.0;
    CHECK_THROWS_WITH(load_image_data(o), Catch::Contains("std must be > 0"));
    o.std = -1.0;
    CHECK_THROWS_WITH(load_image_data(o), Catch::Contains("std must be > 0"));
  }
}

TEST_CASE("image data on the MNIST test set", "[data][images][mnist]") {
  const std::string images = data_test::shared_data_file("mnist/t10k-images-idx3-ubyte.gz");
  const std::string labels = data_test::shared_data_file("mnist/t10k-labels-idx1-ubyte.gz");
  if (images.empty() || labels.empty()) {
    WARN("skipped: MNIST t10k files not found in the data folders");
    return;
  }
  ImageDataOptions o;
  o.train_images = o.test_images = images;
  o.train_labels = o.test_labels = labels;
  o.limit_train = 1000;
  o.shuffle = false;
  o.mean = 0.1307;  // the usual MNIST normalisation (training-set statistics)
  o.std = 0.3081;
  const auto data = load_image_data(o);
  CHECK(data->describe() ==
        "Fashion-MNIST-style IDX: 1000 train / 10000 test images 28x28, 10 classes");
  const Batch first = data->train_batch(0);
  REQUIRE(first.inputs.shape() == Shape{128, 1, 28, 28});
  const std::vector<int32_t> y = first.targets.to_int_vector();
  CHECK(y[0] == 7);
  CHECK(y[1] == 2);
  CHECK(y[2] == 1);
  // 10000 = 78 * 128 + 16.
  REQUIRE(data->eval_batch_count() == 79);
  CHECK(data->eval_batch(78).inputs.size(0) == 16);
  // The test set's pixel mean and standard deviation are known to be about 0.1325 and 0.3105,
  // so after normalising with the training statistics the mean is near 0 and the std near 1.
  double sum = 0.0, sum_sq = 0.0;
  int64_t count = 0;
  for (int64_t m = 0; m < data->eval_batch_count(); ++m) {
    for (float v : data->eval_batch(m).inputs.to_float_vector()) {
      sum += v;
      sum_sq += static_cast<double>(v) * v;
      ++count;
    }
  }
  REQUIRE(count == 10000 * 784);
  const double mean = sum / count;
  const double stddev = std::sqrt(sum_sq / count - mean * mean);
  CHECK(std::abs(mean - (0.1325 - 0.1307) / 0.3081) < 0.01);
  CHECK(std::abs(stddev - 0.3105 / 0.3081) < 0.01);
}

TEST_CASE("image data on Fashion-MNIST when the Debian package is installed",
          "[data][images][fashion]") {
  const std::filesystem::path dir = mixprec_test::kFashionMnistDir;
  if (!std::filesystem::exists(dir / "train-images-idx3-ubyte.gz")) {
    WARN("skipped: Fashion-MNIST not installed under " << dir.string());
    return;
  }
  ImageDataOptions o;
  o.train_images = (dir / "train-images-idx3-ubyte.gz").string();
  o.train_labels = (dir / "train-labels-idx1-ubyte.gz").string();
  o.test_images = (dir / "t10k-images-idx3-ubyte.gz").string();
  o.test_labels = (dir / "t10k-labels-idx1-ubyte.gz").string();
  o.batch_size = 100;
  const auto data = load_image_data(o);
  CHECK(data->describe() ==
        "Fashion-MNIST-style IDX: 60000 train / 10000 test images 28x28, 10 classes");
  CHECK(data->batches_per_epoch() == 600);
  CHECK(data->eval_batch_count() == 100);
  // Fashion-MNIST is balanced: 1000 test images per class.
  std::vector<int> counts(10, 0);
  for (int64_t m = 0; m < data->eval_batch_count(); ++m) {
    for (int32_t y : data->eval_batch(m).targets.to_int_vector()) ++counts[y];
  }
  CHECK(counts == std::vector<int>(10, 1000));
  // And 6000 training images per class, all of them in one shuffled epoch.
  std::fill(counts.begin(), counts.end(), 0);
  for (int64_t n = 0; n < data->batches_per_epoch(); ++n) {
    for (int32_t y : data->train_batch(n).targets.to_int_vector()) ++counts[y];
  }
  CHECK(counts == std::vector<int>(10, 6000));
}

TEST_CASE("image data builds a large batch on several threads with the same bytes",
          "[data][images]") {
  // 12000 images of 6 pixels in one batch: above the size from which make_batch spreads the
  // images over threads, so the parallel path runs; one thread gives the reference.
  TempDir dir;
  ImageDataOptions o = small_options(dir, 12000, 4);
  o.batch_size = 12000;
  o.shuffle = false;
  const auto data = load_image_data(o);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const Batch one = data->train_batch(0);
  omp_set_num_threads(3);
  const Batch three = data->train_batch(0);
  omp_set_num_threads(threads);
  CHECK(same_batch(one, three));
  std::vector<int> examples(12000);
  for (int e = 0; e < 12000; ++e) examples[static_cast<size_t>(e)] = e;
  check_batch_holds(three, examples, 4);
}

namespace {

// A split of `count` 40 x 40 images (more pixels than image_data's conversion chunk of 1024)
// with pixels cycling through all 256 values; labels 0.
std::pair<std::string, std::string> write_large_split(const TempDir& dir, const std::string& name,
                                                      int count) {
  constexpr uint32_t kSide = 40;
  std::vector<uint8_t> pixels, labels(static_cast<size_t>(count), 0);
  for (int e = 0; e < count; ++e)
    for (uint32_t k = 0; k < kSide * kSide; ++k) pixels.push_back(static_cast<uint8_t>(7 * e + 3 * k));
  const std::string images_path = dir.file(name + "-large-images-idx3-ubyte");
  const std::string labels_path = dir.file(name + "-large-labels-idx1-ubyte");
  data_test::write_bytes(images_path,
                         data_test::idx_images(static_cast<uint32_t>(count), kSide, kSide, pixels));
  data_test::write_bytes(labels_path, data_test::idx_labels(labels));
  return {images_path, labels_path};
}

}  // namespace

TEST_CASE("image data builds 16-bit inputs with the bits of its F32 inputs rounded, and "
          "knows them finite", "[data][images]") {
  TempDir dir;
  ImageDataOptions o;
  std::tie(o.train_images, o.train_labels) = write_large_split(dir, "train", 9);
  std::tie(o.test_images, o.test_labels) = write_large_split(dir, "test", 2);
  o.num_classes = 2;
  o.batch_size = 4;
  o.mean = 0.2860;
  o.std = 0.3530;
  const auto data = load_image_data(o);
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    for (int64_t number : {0, 3}) {
      INFO(dtype << ", batch " << number);
      const Batch plain = data->train_batch(number);
      const Batch built = data->train_batch_as(number, dtype);
      REQUIRE(built.inputs.dtype() == dtype);
      CHECK(raw_bytes(built.inputs) == raw_bytes(plain.inputs.to(dtype)));
      CHECK(raw_bytes(built.targets) == raw_bytes(plain.targets));
      CHECK(built.number == plain.number);
      CHECK(built.epoch == plain.epoch);
      REQUIRE(built.input_scan.has_value());
      CHECK(built.input_scan->element == -1);
    }
  }
  // A std that is 0 in FP32 maps pixels to Inf or NaN: the inputs are then scanned as the
  // source made them, then rounded.
  o.std = 1e-50;
  const auto degenerate = load_image_data(o);
  const Batch plain = degenerate->train_batch(1);
  const Batch built = degenerate->train_batch_as(1, DType::F16);
  REQUIRE(built.input_scan.has_value());
  CHECK(built.input_scan->element == scan_inputs(plain.inputs).element);
  CHECK(built.input_scan->element >= 0);
  CHECK(raw_bytes(built.inputs) == raw_bytes(plain.inputs.to(DType::F16)));
}
