#include "core/tensor.h"

#include <algorithm>

#include <cmath>
#include <cstring>
#include <iomanip>
#include <limits>
#include <sstream>

#include "core/autograd/engine.h"
#include "core/autograd/node.h"
#include "core/backend.h"
#include "core/generator.h"
#include "core/ops/ops.h"
#include "core/ops/view.h"

namespace mixprec {

TensorImpl::~TensorImpl() = default;

namespace {

std::shared_ptr<TensorImpl> make_impl(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape)
    MIXPREC_CHECK(d >= 0, "tensor: negative extent in shape ", shape_str(shape));
  const int64_t numel = shape_numel(shape);
  MIXPREC_CHECK(numel <= std::numeric_limits<int64_t>::max() / 4, "tensor: shape ",
                shape_str(shape), " needs more bytes than can be addressed");
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->dtype = dtype;
  impl->storage = std::make_shared<Storage>(static_cast<size_t>(numel) * dtype_size(dtype), device);
  return impl;
}

// The element of `dtype` stored at `bytes` (host memory), as a double.
double host_element(const void* bytes, DType dtype) {
  switch (dtype) {
    case DType::F32: { float v; std::memcpy(&v, bytes, 4); return v; }
    case DType::F16: { uint16_t v; std::memcpy(&v, bytes, 2); return half_bits_to_float(v); }
    case DType::BF16: { uint16_t v; std::memcpy(&v, bytes, 2); return bf16_bits_to_float(v); }
    case DType::I32: { int32_t v; std::memcpy(&v, bytes, 4); return v; }
  }
  return 0;
}

void write_host_element(void* bytes, DType dtype, double value) {
  switch (dtype) {
    case DType::F32: { const float v = static_cast<float>(value); std::memcpy(bytes, &v, 4); return; }
    case DType::F16: { const uint16_t v = float_to_half_bits(static_cast<float>(value)); std::memcpy(bytes, &v, 2); return; }
    case DType::BF16: { const uint16_t v = float_to_bf16_bits(static_cast<float>(value)); std::memcpy(bytes, &v, 2); return; }
    case DType::I32: { const int32_t v = static_cast<int32_t>(value); std::memcpy(bytes, &v, 4); return; }
  }
}

}  // namespace

// ---- factories -------------------------------------------------------------------------------

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  return Tensor(make_impl(shape, dtype, device));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}

Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  if (t.numel() > 0) backend_for(device).fill(t, value);
  return t;
}

Tensor Tensor::scalar(double value, DType dtype, Device device) {
  return full({}, value, dtype, device);
}

Tensor Tensor::arange(double start, double end, double step, DType dtype, Device device) {
  MIXPREC_CHECK(step != 0.0, "arange: step must be non-zero");
  MIXPREC_CHECK(std::isfinite(start) && std::isfinite(end) && std::isfinite(step),
                "arange: start, end and step must be finite");
  const double count = std::ceil((end - start) / step);
  MIXPREC_CHECK(count < 9.0e15, "arange: [", start, ", ", end, ") in steps of ", step,
                " has too many elements (", count, ")");
  Tensor t = empty({count > 0 ? static_cast<int64_t>(count) : 0}, dtype, device);
  if (t.numel() > 0) backend_for(device).arange(t, start, step);
  return t;
}

Tensor Tensor::uniform(const Shape& shape, Generator& gen, float low, float high, DType dtype,
                       Device device) {
  MIXPREC_CHECK(is_floating(dtype), "uniform: dtype must be floating, got ", dtype);
  MIXPREC_CHECK(low <= high, "uniform: low (", low, ") must not exceed high (", high, ")");
  Tensor t = empty(shape, dtype, device);
  const PhiloxKey key = gen.next(static_cast<uint64_t>(t.numel()));
  if (t.numel() > 0) backend_for(device).random_uniform(t, key, low, high);
  return t;
}

Tensor Tensor::normal(const Shape& shape, Generator& gen, float mean, float stddev, DType dtype,
                      Device device) {
  MIXPREC_CHECK(is_floating(dtype), "normal: dtype must be floating, got ", dtype);
  MIXPREC_CHECK(stddev >= 0, "normal: stddev must be >= 0, got ", stddev);
  Tensor t = empty(shape, dtype, device);
  const PhiloxKey key = gen.next(static_cast<uint64_t>(t.numel()));
  if (t.numel() > 0) backend_for(device).random_normal(t, key, mean, stddev);
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& values, const Shape& shape, DType dtype,
                           Device device) {
  MIXPREC_CHECK(is_floating(dtype), "from_vector: float values need a floating dtype, got ", dtype);
  MIXPREC_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_vector: ",
                values.size(), " values do not fill shape ", shape_str(shape));
  Tensor host = empty(shape, DType::F32, kCPU);
  if (!values.empty()) std::memcpy(host.data(), values.data(), values.size() * sizeof(float));
  return ops::cast_untracked(host, dtype).to(device);
}

Tensor Tensor::from_ints(const std::vector<int32_t>& values, const Shape& shape, Device device) {
  MIXPREC_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_ints: ",
                values.size(), " values do not fill shape ", shape_str(shape));
  Tensor host = empty(shape, DType::I32, kCPU);
  if (!values.empty()) std::memcpy(host.data(), values.data(), values.size() * sizeof(int32_t));
  return host.to(device);
}

// ---- metadata --------------------------------------------------------------------------------

void Tensor::require_defined(const char* what) const {
  MIXPREC_CHECK(impl_ != nullptr, what, ": the tensor is undefined");
}

const Shape& Tensor::shape() const {
  require_defined("shape");
  return impl_->shape;
}

int64_t Tensor::size(int64_t d) const { return shape()[normalize_dim(d, dim(), "size")]; }
int64_t Tensor::numel() const { return shape_numel(shape()); }

DType Tensor::dtype() const {
  require_defined("dtype");
  return impl_->dtype;
}

Device Tensor::device() const {
  require_defined("device");
  return impl_->storage->device();
}

void* Tensor::data() {
  require_defined("data");
  impl_->storage->set_index_bounds(std::nullopt);
  return impl_->storage->data();
}

std::optional<Storage::IndexBounds> Tensor::index_bounds() const {
  require_defined("index_bounds");
  return impl_->storage->index_bounds();
}

const void* Tensor::data() const {
  require_defined("data");
  return impl_->storage->data();
}

// ---- copies and conversions ------------------------------------------------------------------

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), dtype(), device());
  if (numel() > 0) backend_for(device()).copy(*this, out);
  return out;
}

Tensor Tensor::detach() const {
  require_defined("detach");
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = impl_->shape;
  impl->dtype = impl_->dtype;
  impl->storage = impl_->storage;
  return Tensor(std::move(impl));
}

Tensor Tensor::to(DType target) const {
  require_defined("to");
  if (target == dtype()) return *this;
  return ops::cast(*this, target);
}

Tensor Tensor::to(Device target) const {
  require_defined("to");
  if (target == device()) return *this;
  Tensor out = empty(shape(), dtype(), target);
  if (numel() == 0) return out;
  if (device().is_cpu()) {
    backend_for(target).copy_from_host(out.data(), data(), nbytes());
    if (dtype() == DType::I32) {
      // Indices on their way to a device: their bounds, read here for free, spare the index
      // checks of embedding and cross-entropy a wait for the device.
      const auto* values = static_cast<const int32_t*>(data());
      const auto [lowest, highest] = std::minmax_element(values, values + numel());
      out.impl_->storage->set_index_bounds(Storage::IndexBounds{*lowest, *highest});
    }
  } else if (target.is_cpu()) {
    backend_for(device()).copy_to_host(out.data(), data(), nbytes());
  } else {
    out = to(kCPU).to(target);
  }
  return out;
}

double Tensor::item() const {
  MIXPREC_CHECK(defined() && numel() == 1, "item: needs a tensor with exactly one element, got ",
                defined() ? describe(*this) : std::string("an undefined tensor"));
  return get(0);
}

double Tensor::get(int64_t flat_index) const {
  MIXPREC_CHECK(flat_index >= 0 && flat_index < numel(), "get: index ", flat_index,
                " is out of range for ", describe(*this));
  const size_t esize = dtype_size(dtype());
  unsigned char bytes[4];
  const auto* src = static_cast<const unsigned char*>(data()) + flat_index * esize;
  if (device().is_cpu()) std::memcpy(bytes, src, esize);
  else backend_for(device()).copy_to_host(bytes, src, esize);
  return host_element(bytes, dtype());
}

void Tensor::set(int64_t flat_index, double value) {
  MIXPREC_CHECK(flat_index >= 0 && flat_index < numel(), "set: index ", flat_index,
                " is out of range for ", describe(*this));
  const size_t esize = dtype_size(dtype());
  unsigned char bytes[4];
  write_host_element(bytes, dtype(), value);
  auto* dst = static_cast<unsigned char*>(data()) + flat_index * esize;
  if (device().is_cpu()) std::memcpy(dst, bytes, esize);
  else backend_for(device()).copy_from_host(dst, bytes, esize);
  mark_modified();
}

namespace {

// All elements of `t`, copied to the host and converted to T (F32 or I32).
template <class T>
std::vector<T> host_values(const Tensor& t) {
  const Tensor host = ops::cast_untracked(t.to(kCPU), dtype_of<T>());
  const T* p = static_cast<const T*>(host.data());
  return std::vector<T>(p, p + t.numel());
}

}  // namespace

std::vector<float> Tensor::to_float_vector() const { return host_values<float>(*this); }
std::vector<int32_t> Tensor::to_int_vector() const { return host_values<int32_t>(*this); }

void Tensor::copy_(const Tensor& src) {
  require_defined("copy_");
  MIXPREC_CHECK(src.defined() && src.shape() == shape(), "copy_: source ",
                src.defined() ? describe(src) : std::string("(undefined)"),
                " does not match destination ", describe(*this));
  if (numel() == 0) return;
  Tensor s = src.device() == device() ? src : src.detach().to(device());
  if (s.dtype() == dtype()) backend_for(device()).copy(s, *this);
  else backend_for(device()).cast(s, *this);
  // Indices copied over the whole storage keep their known bounds, so that a tensor refilled
  // in place (the fixed batch of a recorded step) spares the index checks a device read.
  if (dtype() == DType::I32 && s.dtype() == DType::I32 && nbytes() == impl_->storage->nbytes())
    impl_->storage->set_index_bounds(s.index_bounds());
  mark_modified();
}

void Tensor::fill_(double value) {
  require_defined("fill_");
  if (numel() > 0) backend_for(device()).fill(*this, value);
  mark_modified();
}

void Tensor::mark_modified() {
  require_defined("mark_modified");
  impl_->storage->bump_version();
}

Tensor Tensor::reshape(const Shape& new_shape) const { return ops::reshape(*this, new_shape); }

// ---- autograd --------------------------------------------------------------------------------

AutogradMeta& Tensor::autograd_meta() const {
  require_defined("autograd");
  if (!impl_->autograd) impl_->autograd = std::make_unique<AutogradMeta>();
  return *impl_->autograd;
}

bool Tensor::requires_grad() const {
  return defined() && impl_->autograd && impl_->autograd->requires_grad;
}

Tensor& Tensor::set_requires_grad(bool requires_grad) {
  MIXPREC_CHECK(is_leaf(), "set_requires_grad: only leaf tensors can change requires_grad; ",
                describe(*this), " was produced by '", grad_fn()->name(),
                "' (use detach() to make a leaf)");
  MIXPREC_CHECK(!requires_grad || is_floating(dtype()),
                "set_requires_grad: only floating tensors can require grad, got ", describe(*this));
  autograd_meta().requires_grad = requires_grad;
  return *this;
}

bool Tensor::is_leaf() const { return !grad_fn(); }

Tensor Tensor::grad() const {
  return defined() && impl_->autograd ? impl_->autograd->grad : Tensor();
}

void Tensor::set_grad(const Tensor& grad) {
  if (grad.defined()) {
    MIXPREC_CHECK(grad.shape() == shape() && grad.device() == device() && is_floating(grad.dtype()),
                  "set_grad: gradient ", describe(grad), " does not fit ", describe(*this),
                  " (it needs the same shape and device and a floating dtype)");
  }
  AutogradMeta& meta = autograd_meta();
  meta.grad = grad;
  meta.grad_scale = 1.0;
  meta.grad_zeroed = false;
}

void Tensor::reset_grad() {
  if (defined() && impl_->autograd) {
    impl_->autograd->grad = Tensor();
    impl_->autograd->grad_scale = 1.0;
    impl_->autograd->grad_zeroed = false;
  }
}

bool Tensor::grad_zeroed() const {
  return defined() && impl_->autograd && impl_->autograd->grad_zeroed;
}

void Tensor::zero_grad() {
  if (!defined() || !impl_->autograd || !impl_->autograd->grad.defined()) return;
  impl_->autograd->grad.zero_();
  impl_->autograd->grad_scale = 1.0;
  impl_->autograd->grad_zeroed = true;
}

double Tensor::loss_scale() const {
  return defined() && impl_->autograd ? impl_->autograd->loss_scale : 1.0;
}

void Tensor::set_loss_scale(double scale) {
  MIXPREC_CHECK(std::isfinite(scale) && scale > 0, "set_loss_scale: the scale must be finite and "
                "positive, got ", scale);
  autograd_meta().loss_scale = scale;
}

double Tensor::grad_scale() const {
  return defined() && impl_->autograd ? impl_->autograd->grad_scale : 1.0;
}

void Tensor::set_grad_scale(double scale) {
  MIXPREC_CHECK(std::isfinite(scale) && scale > 0, "set_grad_scale: the scale must be finite and "
                "positive, got ", scale);
  AutogradMeta& meta = autograd_meta();
  meta.grad_scale = scale;
  meta.grad_zeroed = false;
}

void Tensor::set_grad_dtype(DType dtype) {
  MIXPREC_CHECK(is_floating(dtype), "set_grad_dtype: gradients must be floating, got ", dtype);
  autograd_meta().grad_dtype = dtype;
}

std::shared_ptr<Node> Tensor::grad_fn() const {
  return defined() && impl_->autograd ? impl_->autograd->grad_fn : nullptr;
}

Tensor& Tensor::set_name(const std::string& name) {
  autograd_meta().name = name;
  return *this;
}

std::string Tensor::name() const {
  return defined() && impl_->autograd ? impl_->autograd->name : std::string();
}

void Tensor::backward(const Tensor& grad, BackwardOptions options) const {
  require_defined("backward");
  Tensor g = grad;
  if (!g.defined()) {
    MIXPREC_CHECK(numel() == 1, "backward: a gradient must be given for the non-scalar ",
                  describe(*this), " (only one-element tensors default to a gradient of 1)");
    g = Tensor::ones(shape(), dtype(), device());
  }
  run_backward(*this, g, options);
}

// ---- printing --------------------------------------------------------------------------------

std::string describe(const Tensor& t) {
  if (!t.defined()) return "(undefined tensor)";
  std::ostringstream out;
  out << t.dtype() << shape_str(t.shape());
  if (!t.device().is_cpu()) out << " on " << t.device();
  return out.str();
}

std::string Tensor::to_string(int64_t max_elements) const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream out;
  out << "Tensor(" << describe(*this) << ", [";
  const int64_t n = numel();
  const int64_t shown = std::min(n, max_elements);
  Tensor host = detach().to(kCPU);
  out << std::setprecision(6);
  for (int64_t i = 0; i < shown; ++i) out << (i ? ", " : "") << host.get(i);
  if (shown < n) out << ", ... (" << n - shown << " more)";
  out << "]";
  if (requires_grad()) out << ", requires_grad";
  if (grad_fn()) out << ", grad_fn=" << grad_fn()->name();
  out << ")";
  return out.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.to_string(); }

}  // namespace mixprec
