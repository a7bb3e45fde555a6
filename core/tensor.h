// Tensor: a handle (shared, like torch::Tensor) to a shape, a dtype, a device and a shared
// Storage. Always contiguous row-major. Copying a Tensor shares data and graph identity;
// `clone()` is the explicit deep copy. The tensor knows nothing about the graph beyond an
// AutogradMeta pointer (core/autograd/).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/shape.h"
#include "core/storage.h"

namespace mixprec {

class Generator;
class Node;
struct AutogradMeta;

struct TensorImpl {
  Shape shape;
  DType dtype = DType::F32;
  std::shared_ptr<Storage> storage;
  std::unique_ptr<AutogradMeta> autograd;  // null until the tensor takes part in autograd
  ~TensorImpl();
};

// What backward() does with a leaf's existing .grad.
enum class GradMode : uint8_t { Accumulate, Overwrite };

struct BackwardOptions {
  bool retain_graph = false;
  GradMode grad_mode = GradMode::Accumulate;
};

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false

  // ---- factories (uninitialised / filled) ------------------------------------------------
  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = kCPU);
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = kCPU);
  static Tensor ones(const Shape& shape, DType dtype = DType::F32, Device device = kCPU);
  static Tensor full(const Shape& shape, double value, DType dtype = DType::F32,
                     Device device = kCPU);
  // [start, end) in steps of `step`, 1-D.
  static Tensor arange(double start, double end, double step = 1.0, DType dtype = DType::F32,
                       Device device = kCPU);
  // Seeded random fills: the same generator state gives the same values on every backend.
  static Tensor uniform(const Shape& shape, Generator& gen, float low = 0.f, float high = 1.f,
                        DType dtype = DType::F32, Device device = kCPU);
  static Tensor normal(const Shape& shape, Generator& gen, float mean = 0.f, float stddev = 1.f,
                       DType dtype = DType::F32, Device device = kCPU);
  // Values are converted (rounded once) into `dtype`; numel must match the shape.
  // (Integers have their own name: a braced list of numbers would be ambiguous.)
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape,
                            DType dtype = DType::F32, Device device = kCPU);
  static Tensor from_ints(const std::vector<int32_t>& values, const Shape& shape,
                            Device device = kCPU);
  static Tensor scalar(double value, DType dtype = DType::F32, Device device = kCPU);

  // ---- metadata ---------------------------------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  // Extent of dimension `d`; negative counts from the end.
  int64_t size(int64_t d) const;
  int64_t numel() const;
  DType dtype() const;
  Device device() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
  // Writable access forgets the storage's index bounds (Storage::index_bounds).
  void* data();
  const void* data() const;
  // Bounds of an I32 tensor's values known without reading its device (Storage::index_bounds);
  // empty when unknown.
  std::optional<Storage::IndexBounds> index_bounds() const;
  // Typed pointer; throws when T does not match dtype (half/bfloat16 via core/half.h).
  template <class T>
  T* data_as();
  template <class T>
  const T* data_as() const;
  // True when both handles share one TensorImpl.
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }

  // ---- copies and conversions -------------------------------------------------------------
  // Deep copy of the data; the result is a new leaf outside any graph.
  Tensor clone() const;
  // Shares the data, drops the graph.
  Tensor detach() const;
  // Differentiable cast (gradient cast back to this dtype). Same dtype returns *this.
  Tensor to(DType dtype) const;
  // Copy to another device (not differentiable). Same device returns *this.
  Tensor to(Device device) const;
  // Value of a one-element tensor, converted to double.
  double item() const;
  // Element access by flat index, for tests and debugging (copies from the device).
  double get(int64_t flat_index) const;
  // In place: bumps the storage's version (see mark_modified).
  void set(int64_t flat_index, double value);
  // All elements converted to float / int32 (copies from the device).
  std::vector<float> to_float_vector() const;
  std::vector<int32_t> to_int_vector() const;
  // Overwrites this tensor's data with `src` (same shape; dtype converted). Not recorded.
  // copy_, fill_ and zero_ write in place and bump the storage's version (see mark_modified).
  // copy_ of an I32 source over a whole I32 tensor carries the source's index bounds.
  void copy_(const Tensor& src);
  void fill_(double value);
  void zero_() { fill_(0.0); }
  // Records an in-place write to this tensor's data. Call it after writing an existing
  // tensor through a Backend primitive (an optimizer step, a running-statistics update):
  // the primitives cannot tell a fresh output from a live one, so they never do this
  // themselves. A backward that needs a tensor saved before the write then throws, naming
  // the op, instead of silently using the new values. Shared by every tensor over the same
  // storage (detach(), reshape views).
  void mark_modified();
  // Same data, new shape (numel must match). Differentiable.
  Tensor reshape(const Shape& shape) const;

  // ---- autograd ---------------------------------------------------------------------------
  bool requires_grad() const;
  // Only leaves (tensors not produced by a recorded op) may change this.
  Tensor& set_requires_grad(bool requires_grad);
  bool is_leaf() const;
  // The accumulated gradient of a leaf, or an undefined tensor.
  Tensor grad() const;
  void set_grad(const Tensor& grad);
  // Drops .grad (the next backward writes a fresh buffer).
  void reset_grad();
  // Zero-fills .grad in place, keeping the buffer (nothing happens when there is none).
  // Zeros carry no loss scale: the next backward may use any scale and tags the buffer with
  // it (see loss_scale() below).
  void zero_grad();
  // True when .grad holds the zeros of zero_grad() and no backward has written it since.
  bool grad_zeroed() const;
  // Dtype that this leaf's .grad is kept in (default: the tensor's own dtype). Mixed
  // precision keeps FP32 gradient buffers for FP16/BF16 parameters.
  void set_grad_dtype(DType dtype);
  std::shared_ptr<Node> grad_fn() const;
  // Loss scaling (amp/). A loss multiplied by a loss scale S carries S as its loss_scale();
  // a backward from it tags every leaf .grad it writes with grad_scale() = S. Accumulating a
  // gradient into a .grad tagged with another scale throws before any .grad is touched: the
  // sum could not be restored by one division. set_grad() and reset_grad() set the tag to 1
  // (true scale); GradScaler::unscale sets it to 1 after dividing.
  double loss_scale() const;
  void set_loss_scale(double scale);
  double grad_scale() const;
  void set_grad_scale(double scale);
  // Name shown in anomaly reports and diagnostics.
  Tensor& set_name(const std::string& name);
  std::string name() const;
  // Backpropagates from this tensor. `grad` defaults to ones for a one-element tensor and
  // is required otherwise.
  void backward(const Tensor& grad = Tensor(), BackwardOptions options = {}) const;

  // ---- printing ---------------------------------------------------------------------------
  std::string to_string(int64_t max_elements = 64) const;

  // Internal: graph plumbing for core/autograd.
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  AutogradMeta& autograd_meta() const;  // creates it on first use
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

 private:
  void require_defined(const char* what) const;
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// "F16[2, 3]", with " on <device>" appended for a tensor not on the CPU ("F16[2, 3] on
// cuda:0") — used in error messages.
std::string describe(const Tensor& t);

}  // namespace mixprec

#include "core/tensor_inl.h"
