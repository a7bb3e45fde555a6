// Image data: the IDX bytes are kept as they are (a quarter of the memory of floats) and a
// batch maps them to FP32 with the arithmetic of torchvision's ToTensor and Normalize, so
// every batch gives the same numbers.
#include "apps/data/image_data.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <sstream>
#include <utility>
#include <vector>

#include "apps/data/idx_file.h"
#include "core/convert.h"
#include "core/error.h"
#include "core/philox.h"

namespace mixprec {
namespace {

struct Split {
  int64_t count = 0;
  std::vector<uint8_t> pixels;  // count * rows * cols
  std::vector<uint8_t> labels;  // count
};

// Reads one split's images and labels, checks them against each other and against
// num_classes, then keeps the first `limit` examples (all of them when limit is 0).
Split read_split(const std::string& images_path, const std::string& labels_path,
                 const char* split_name, int64_t num_classes, int64_t limit, int64_t& rows,
                 int64_t& cols) {
  IdxImages images = read_idx_images(images_path);
  std::vector<uint8_t> labels = read_idx_labels(labels_path);
  MIXPREC_CHECK(images.count == static_cast<int64_t>(labels.size()), split_name, " split: '",
                images_path, "' holds ", images.count, " images but '", labels_path, "' holds ",
                labels.size(), " labels");
  for (size_t i = 0; i < labels.size(); ++i) {
    MIXPREC_CHECK(labels[i] < num_classes, "IDX file '", labels_path, "': label ",
                  static_cast<int>(labels[i]), " at index ", i, " is out of range [0, ",
                  num_classes, ")");
  }
  if (rows == 0) {
    rows = images.rows;
    cols = images.cols;
  }
  MIXPREC_CHECK(images.rows == rows && images.cols == cols, split_name, " split: '", images_path,
                "' holds ", images.rows, "x", images.cols, " images, the training split ", rows,
                "x", cols);
  Split split;
  split.count = limit > 0 ? std::min(limit, images.count) : images.count;
  images.pixels.resize(static_cast<size_t>(split.count * rows * cols));
  labels.resize(static_cast<size_t>(split.count));
  split.pixels = std::move(images.pixels);
  split.labels = std::move(labels);
  return split;
}

// Pixels in a batch above which it is built by several threads.
constexpr int64_t kParallelBatchWork = int64_t{1} << 16;

// A 64-bit random word for `counter` under `seed`.
uint64_t philox_u64(uint64_t seed, uint64_t counter) {
  const Philox4 r = philox4x32(seed, counter);
  return (static_cast<uint64_t>(r.v[0]) << 32) | r.v[1];
}

class ImageData final : public BatchSource {
 public:
  ImageData(ImageDataOptions options, Split train, Split test, int64_t rows, int64_t cols)
      : options_(std::move(options)), train_(std::move(train)), test_(std::move(test)),
        rows_(rows), cols_(cols), normalise_(options_.mean.has_value()),
        mean_(normalise_ ? static_cast<float>(*options_.mean) : 0.f),
        stddev_(normalise_ ? static_cast<float>(*options_.std) : 1.f),
        values_finite_(all_values_finite()) {}

  Batch train_batch(int64_t number) const override {
    return make_batch(train_, train_indices(number), number, epoch_of(number), DType::F32);
  }

  // Inputs built in input_dtype directly (one pass fewer over the batch than building F32
  // and rounding it), and no scan when no pixel can map to Inf or NaN; a normalisation that
  // can (a std that rounds to 0 in FP32) takes the default's scan and rounding instead.
  Batch train_batch_as(int64_t number, DType input_dtype) const override {
    if (!values_finite_) return BatchSource::train_batch_as(number, input_dtype);
    Batch batch = make_batch(train_, train_indices(number), number, epoch_of(number), input_dtype);
    batch.input_scan = InputScan{};
    return batch;
  }

  int64_t batches_per_epoch() const override { return train_.count / options_.batch_size; }

  int64_t eval_batch_count() const override {
    return (test_.count + options_.batch_size - 1) / options_.batch_size;
  }

  Batch eval_batch(int64_t number) const override {
    MIXPREC_CHECK(number >= 0 && number < eval_batch_count(), "image data: evaluation batch ",
                  number, " is out of range [0, ", eval_batch_count(), ")");
    const int64_t first = number * options_.batch_size;
    const int64_t size = std::min(options_.batch_size, test_.count - first);
    std::vector<int64_t> indices(static_cast<size_t>(size));
    for (int64_t i = 0; i < size; ++i) indices[i] = first + i;
    return make_batch(test_, indices, number, 0, DType::F32);
  }

  bool is_classification() const override { return true; }
  int64_t num_classes() const override { return options_.num_classes; }
  std::optional<int64_t> input_index_bound() const override { return std::nullopt; }

  std::string describe() const override {
    std::ostringstream out;
    out << "Fashion-MNIST-style IDX: " << train_.count << " train / " << test_.count
        << " test images " << rows_ << "x" << cols_ << ", " << options_.num_classes
        << " classes";
    return out.str();
  }

 private:
  int64_t epoch_of(int64_t number) const { return number / batches_per_epoch(); }

  // The examples of training batch `number` (its epoch's shuffled order, or file order).
  std::vector<int64_t> train_indices(int64_t number) const {
    MIXPREC_CHECK(number >= 0, "image data: training batch number must be >= 0, got ", number);
    const int64_t per_epoch = batches_per_epoch();
    const int64_t epoch = number / per_epoch;
    const int64_t first = (number % per_epoch) * options_.batch_size;
    std::vector<int64_t> indices(static_cast<size_t>(options_.batch_size));
    if (options_.shuffle) {
      const std::shared_ptr<const std::vector<int32_t>> order = epoch_order(epoch);
      for (int64_t i = 0; i < options_.batch_size; ++i) indices[i] = (*order)[first + i];
    } else {
      for (int64_t i = 0; i < options_.batch_size; ++i) indices[i] = first + i;
    }
    return indices;
  }

  // The batch of `indices` with its inputs in `dtype` (F32, F16 or BF16): the FP32 values of
  // to_values, rounded as the bulk converters (core/convert.h) round them, which is what
  // Tensor::to does.
  Batch make_batch(const Split& split, const std::vector<int64_t>& indices, int64_t number,
                   int64_t epoch, DType dtype) const {
    const int64_t n = static_cast<int64_t>(indices.size());
    const int64_t image_size = rows_ * cols_;
    MIXPREC_CHECK(is_floating(dtype), "image data: inputs must be F32, F16 or BF16, not ", dtype);
    Batch batch;
    batch.inputs = Tensor::empty({n, 1, rows_, cols_}, dtype);
    batch.targets = Tensor::empty({n}, DType::I32);
    auto* inputs = static_cast<unsigned char*>(batch.inputs.data());
    const size_t value_size = dtype_size(dtype);
    int32_t* targets = batch.targets.data_as<int32_t>();
    // Images are independent, so a large batch is spread over threads: on a GPU the step can
    // take less time than one thread needs to build the next batch (512 MNIST images: about
    // 0.5 ms). The prefetcher's thread leads its own team; the bytes are the same either way.
#pragma omp parallel for schedule(static) if (n * image_size > kParallelBatchWork)
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* pixels = split.pixels.data() + indices[i] * image_size;
      store_values(pixels, image_size, dtype, inputs + i * image_size * value_size);
      targets[i] = split.labels[indices[i]];
    }
    batch.number = number;
    batch.epoch = epoch;
    return batch;
  }

  // to_values into `out` in `dtype`: directly for F32, else through a buffer of floats per
  // chunk, rounded by the bulk converters.
  void store_values(const uint8_t* pixels, int64_t count, DType dtype, unsigned char* out) const {
    if (dtype == DType::F32) return to_values(pixels, count, reinterpret_cast<float*>(out));
    constexpr int64_t kChunk = 1024;
    float values[kChunk];
    auto* out16 = reinterpret_cast<uint16_t*>(out);
    for (int64_t k = 0; k < count; k += kChunk) {
      const auto len = static_cast<size_t>(std::min(kChunk, count - k));
      to_values(pixels + k, static_cast<int64_t>(len), values);
      if (dtype == DType::F16) convert_f32_to_f16(values, out16 + k, len);
      else convert_f32_to_bf16(values, out16 + k, len);
    }
  }

  // Whether every one of the 256 pixel values maps to a finite input.
  bool all_values_finite() const {
    uint8_t pixels[256];
    float values[256];
    for (int p = 0; p < 256; ++p) pixels[p] = static_cast<uint8_t>(p);
    to_values(pixels, 256, values);
    for (float v : values)
      if (!std::isfinite(v)) return false;
    return true;
  }

  // ToTensor then Normalize in FP32, x = p / 255 then (x - mean) / std, computed for every
  // pixel rather than looked up in a table: a lookup is a dependent load per pixel (or a
  // gather, slower still), while the divisions vectorise (BM_ImageBatch measures it).
  void to_values(const uint8_t* __restrict pixels, int64_t count, float* __restrict out) const {
    if (!normalise_) {
      for (int64_t k = 0; k < count; ++k) out[k] = static_cast<float>(pixels[k]) / 255.f;
      return;
    }
    const float mean = mean_, stddev = stddev_;
    for (int64_t k = 0; k < count; ++k) {
      out[k] = (static_cast<float>(pixels[k]) / 255.f - mean) / stddev;
    }
  }

  // Epoch e's order: Fisher-Yates over 0..N-1, step k (i = N-1-k) swapping i with a j drawn
  // uniformly from [0, i] by counter e * N + k. The modulo bias of a 64-bit word reduced to
  // at most 2^32 values is below 2^-32. An epoch's order is kept until another epoch is asked
  // for: consecutive batches share it, and computing it costs N Philox calls.
  std::shared_ptr<const std::vector<int32_t>> epoch_order(int64_t epoch) const {
    std::lock_guard<std::mutex> lock(order_mutex_);
    if (order_ != nullptr && order_epoch_ == epoch) return order_;
    const int64_t n = train_.count;
    auto order = std::make_shared<std::vector<int32_t>>(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) (*order)[i] = static_cast<int32_t>(i);
    const uint64_t base = static_cast<uint64_t>(epoch) * static_cast<uint64_t>(n);
    for (int64_t k = 0; k + 1 < n; ++k) {
      const int64_t i = n - 1 - k;
      const uint64_t j = philox_u64(options_.seed, base + k) % static_cast<uint64_t>(i + 1);
      std::swap((*order)[i], (*order)[j]);
    }
    order_ = std::move(order);
    order_epoch_ = epoch;
    return order_;
  }

  ImageDataOptions options_;
  Split train_, test_;
  int64_t rows_, cols_;
  bool normalise_;
  float mean_, stddev_;
  bool values_finite_;  // all_values_finite(): no pixel maps to Inf or NaN
  mutable std::mutex order_mutex_;
  mutable std::shared_ptr<const std::vector<int32_t>> order_;
  mutable int64_t order_epoch_ = -1;
};

}  // namespace

std::unique_ptr<BatchSource> load_image_data(const ImageDataOptions& options) {
  MIXPREC_CHECK(options.num_classes >= 1, "image data: num_classes must be >= 1, got ",
                options.num_classes);
  MIXPREC_CHECK(options.num_classes <= 256, "image data: num_classes ", options.num_classes,
                " exceeds what a one-byte IDX label can name (256)");
  MIXPREC_CHECK(options.batch_size >= 1, "image data: batch_size must be >= 1, got ",
                options.batch_size);
  MIXPREC_CHECK(options.limit_train >= 0 && options.limit_test >= 0,
                "image data: limit_train and limit_test must be >= 0 (0: no limit), got ",
                options.limit_train, " and ", options.limit_test);
  MIXPREC_CHECK(options.mean.has_value() == options.std.has_value(),
                "image data: give both mean and std or neither, got only ",
                options.mean.has_value() ? "mean" : "std");
  if (options.mean.has_value()) {
    MIXPREC_CHECK(std::isfinite(*options.mean), "image data: mean must be finite, got ",
                  *options.mean);
    MIXPREC_CHECK(std::isfinite(*options.std) && *options.std > 0.0,
                  "image data: std must be > 0 and finite, got ", *options.std);
  }
  int64_t rows = 0, cols = 0;
  Split train = read_split(options.train_images, options.train_labels, "training",
                           options.num_classes, options.limit_train, rows, cols);
  Split test = read_split(options.test_images, options.test_labels, "test", options.num_classes,
                          options.limit_test, rows, cols);
  MIXPREC_CHECK(options.batch_size <= train.count, "image data: batch_size ", options.batch_size,
                " is larger than the training split ('", options.train_images, "', ",
                train.count, " examples)");
  // The shuffled order is kept as int32 indices.
  MIXPREC_CHECK(train.count <= INT32_MAX, "image data: '", options.train_images, "' holds ",
                train.count, " examples, more than the 2^31 - 1 supported");
  return std::make_unique<ImageData>(options, std::move(train), std::move(test), rows, cols);
}

}  // namespace mixprec
