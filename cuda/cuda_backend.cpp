// The CUDA backend: validation (with the CPU backend's messages), memory and launches. The
// kernels are in cuda/kernels/, one file per family.
#include "cuda/cuda_backend.h"

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>

#include "core/error.h"
#include "core/half.h"
#include "core/tensor.h"
#include "cuda/cuda_check.h"
#include "cuda/kernels/amp.h"
#include "cuda/kernels/broadcast.h"
#include "cuda/kernels/cast.h"
#include "cuda/kernels/checks.h"
#include "cuda/kernels/elementwise.h"
#include "cuda/kernels/fill.h"
#include "cuda/kernels/random.h"

namespace mixprec {
namespace {

// Every tensor of `ts` (null entries skipped) has the dtype of the first.
void check_same_dtype(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = *ts.begin();
  for (const Tensor* t : ts) {
    if (t == nullptr) continue;
    MIXPREC_CHECK(t->dtype() == first->dtype(), op, ": dtype mismatch between ",
                  describe(*first), " and ", describe(*t));
  }
}

void check_same_shape(const char* op, const Tensor& a, const Tensor& b) {
  MIXPREC_CHECK(a.shape() == b.shape(), op, ": shape mismatch between ", describe(a), " and ",
                describe(b));
}

// `in` broadcasts to `out` (right-aligned; each extent 1 or equal).
bool broadcasts_to(const Shape& in, const Shape& out) {
  if (in.size() > out.size()) return false;
  const size_t lead = out.size() - in.size();
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i] != 1 && in[i] != out[lead + i]) return false;
  return true;
}

[[noreturn]] void not_implemented(const char* primitive) {
  MIXPREC_FAIL(primitive, ": not implemented on the CUDA backend yet; run this op on the CPU "
               "(move its tensors there with .to(kCPU))");
}

// The bit pattern that `fill` stores: the value converted as the CPU backend converts it.
uint32_t fill_pattern(DType dtype, double value) {
  switch (dtype) {
    case DType::F32: return detail::f32_to_bits(static_cast<float>(value));
    case DType::F16: return float_to_half_bits(static_cast<float>(value));
    case DType::BF16: return float_to_bf16_bits(static_cast<float>(value));
    case DType::I32: return static_cast<uint32_t>(static_cast<int32_t>(value));
  }
  MIXPREC_FAIL("fill: unknown dtype ", static_cast<int>(dtype));
}

}  // namespace

// ---- set-up -------------------------------------------------------------------------------

CudaBackend::CudaBackend(int device_index)
    : device_index_(device_index), allocator_(device_index) {
  use_device();
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

CudaBackend::~CudaBackend() {
  // Statuses are ignored: at process exit the runtime may already be unloading.
  if (cudaSetDevice(device_index_) == cudaSuccess) {
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    if (cudnn_ != nullptr) cudnnDestroy(cudnn_);
    if (cublaslt_ != nullptr) cublasLtDestroy(cublaslt_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaGetLastError();
}

void CudaBackend::use_device() const { CUDA_CHECK(cudaSetDevice(device_index_)); }

void CudaBackend::check_here(const char* op, const char* what, const Tensor& t) const {
  MIXPREC_CHECK(t.defined(), op, ": ", what, " is undefined; pass a tensor on ", device());
  MIXPREC_CHECK(t.device() == device(), op, ": ", what, " ", describe(t), " is not on ",
                device(), "; move it there with .to(", device(), ") first");
}

cublasLtHandle_t CudaBackend::cublaslt_handle() {
  std::lock_guard<std::mutex> lock(handles_mutex_);
  if (cublaslt_ == nullptr) {
    use_device();
    CUBLAS_CHECK(cublasLtCreate(&cublaslt_));
  }
  return cublaslt_;
}

cudnnHandle_t CudaBackend::cudnn_handle() {
  std::lock_guard<std::mutex> lock(handles_mutex_);
  if (cudnn_ == nullptr) {
    use_device();
    cudnnHandle_t handle = nullptr;
    CUDNN_CHECK(cudnnCreate(&handle));
    const cudnnStatus_t bound = cudnnSetStream(handle, stream_);
    if (bound != CUDNN_STATUS_SUCCESS) {
      cudnnDestroy(handle);
      CUDNN_CHECK(bound);
    }
    cudnn_ = handle;
  }
  return cudnn_;
}

// ---- memory -------------------------------------------------------------------------------

void* CudaBackend::allocate(size_t nbytes) { return allocator_.allocate(nbytes); }

void CudaBackend::deallocate(void* ptr, size_t) noexcept { allocator_.deallocate(ptr); }

void CudaBackend::copy_from_host(void* dst, const void* host_src, size_t nbytes) {
  if (nbytes == 0) return;
  use_device();
  // From pageable memory the runtime stages the bytes before returning, so the caller may
  // reuse host_src at once; the transfer itself is ordered on the stream.
  CUDA_CHECK(cudaMemcpyAsync(dst, host_src, nbytes, cudaMemcpyHostToDevice, stream_));
}

void CudaBackend::copy_to_host(void* host_dst, const void* src, size_t nbytes) {
  use_device();
  host_syncs_.fetch_add(1, std::memory_order_relaxed);
  if (nbytes > 0) CUDA_CHECK(cudaMemcpyAsync(host_dst, src, nbytes, cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::synchronize() {
  use_device();
  host_syncs_.fetch_add(1, std::memory_order_relaxed);
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// ---- fills, casts, copies -----------------------------------------------------------------

void CudaBackend::fill(Tensor& out, double value) {
  check_here("fill", "out", out);
  if (out.numel() == 0) return;
  use_device();
  kernels::fill_bits(out.data(), dtype_size(out.dtype()), fill_pattern(out.dtype(), value),
                     out.numel(), stream_);
}

void CudaBackend::arange(Tensor& out, double start, double step) {
  check_here("arange", "out", out);
  use_device();
  kernels::arange(out.data(), out.dtype(), start, step, out.numel(), stream_);
}

void CudaBackend::random_uniform(Tensor& out, PhiloxKey key, float low, float high) {
  check_here("random_uniform", "out", out);
  use_device();
  kernels::random_uniform(out.data(), out.dtype(), out.numel(), key, low, high, stream_);
}

void CudaBackend::random_normal(Tensor& out, PhiloxKey key, float mean, float stddev) {
  check_here("random_normal", "out", out);
  use_device();
  kernels::random_normal(out.data(), out.dtype(), out.numel(), key, mean, stddev, stream_);
}

void CudaBackend::cast(const Tensor& x, Tensor& y) {
  check_here("cast", "x", x);
  check_here("cast", "y", y);
  MIXPREC_CHECK(x.numel() == y.numel(), "cast: ", describe(x), " and ", describe(y),
                " differ in size");
  if (x.dtype() == y.dtype()) return copy(x, y);
  use_device();
  kernels::cast(x.data(), x.dtype(), y.data(), y.dtype(), x.numel(), stream_);
}

void CudaBackend::copy(const Tensor& x, Tensor& y) {
  check_here("copy", "x", x);
  check_here("copy", "y", y);
  MIXPREC_CHECK(x.dtype() == y.dtype() && x.numel() == y.numel(), "copy: ", describe(x),
                " and ", describe(y), " differ");
  if (x.numel() == 0 || x.data() == y.data()) return;
  use_device();
  CUDA_CHECK(cudaMemcpyAsync(y.data(), x.data(), x.nbytes(), cudaMemcpyDeviceToDevice, stream_));
}

// ---- elementwise ----------------------------------------------------------------------------

void CudaBackend::unary(UnaryOp op, const Tensor& x, Tensor& y) {
  check_here("unary", "x", x);
  check_here("unary", "y", y);
  check_same_dtype("unary", {&x, &y});
  check_same_shape("unary", x, y);
  use_device();
  kernels::unary(op, x.dtype(), x.data(), y.data(), x.numel(), stream_);
}

void CudaBackend::unary_backward(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& dy,
                                 Tensor& dx) {
  check_here("unary_backward", "x", x);
  for (const Tensor* t : std::initializer_list<const Tensor*>{&y, &dy, &dx}) {
    check_here("unary_backward", "operand", *t);
    check_same_dtype("unary_backward", {&x, t});
    check_same_shape("unary_backward", x, *t);
  }
  use_device();
  kernels::unary_backward(op, x.dtype(), x.data(), y.data(), dy.data(), dx.data(), x.numel(),
                          stream_);
}

void CudaBackend::affine(const Tensor& x, float alpha, float beta, Tensor& y) {
  check_here("affine", "x", x);
  check_here("affine", "y", y);
  check_same_dtype("affine", {&x, &y});
  check_same_shape("affine", x, y);
  use_device();
  kernels::affine(x.dtype(), x.data(), alpha, beta, y.data(), x.numel(), stream_);
}

void CudaBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  check_here("binary", "a", a);
  check_here("binary", "b", b);
  check_here("binary", "out", out);
  check_same_dtype("binary", {&a, &out});
  check_same_dtype("binary", {&b, &out});
  MIXPREC_CHECK(broadcasts_to(a.shape(), out.shape()) && broadcasts_to(b.shape(), out.shape()),
                "binary: ", describe(a), " and ", describe(b), " do not broadcast to ",
                describe(out));
  if (out.numel() == 0) return;
  use_device();
  kernels::binary(op, out.dtype(), a.data(), a.shape(), b.data(), b.shape(), out.data(),
                  out.shape(), stream_);
}

void CudaBackend::sum_to(const Tensor& x, Tensor& y, float scale) {
  check_here("sum_to", "x", x);
  check_here("sum_to", "y", y);
  check_same_dtype("sum_to", {&x, &y});
  MIXPREC_CHECK(broadcasts_to(y.shape(), x.shape()), "sum_to: ", describe(y),
                " does not broadcast to ", describe(x));
  if (y.numel() == 0) return;
  if (x.numel() == 0) return fill(y, 0.0);
  use_device();
  if (x.numel() == y.numel()) {
    kernels::scale(x.dtype(), x.data(), scale, y.data(), x.numel(), stream_);
    return;
  }
  const kernels::SumToPlan plan = kernels::plan_sum_to(x.shape(), y.shape());
  Scratch scratch(allocator_, plan.scratch_floats() * sizeof(float));
  kernels::sum_to(plan, x.dtype(), x.data(), y.data(), scale, static_cast<float*>(scratch.get()),
                  stream_);
}

void CudaBackend::expand(const Tensor& x, Tensor& y, float scale) {
  check_here("expand", "x", x);
  check_here("expand", "y", y);
  check_same_dtype("expand", {&x, &y});
  MIXPREC_CHECK(broadcasts_to(x.shape(), y.shape()), "expand: ", describe(x),
                " does not broadcast to ", describe(y));
  if (y.numel() == 0) return;
  use_device();
  kernels::expand(x.dtype(), x.data(), x.shape(), y.data(), y.shape(), scale, stream_);
}

void CudaBackend::causal_mask(const Tensor& x, float fill, Tensor& y) {
  check_here("causal_mask", "x", x);
  check_here("causal_mask", "y", y);
  check_same_dtype("causal_mask", {&x, &y});
  check_same_shape("causal_mask", x, y);
  MIXPREC_CHECK(x.dim() >= 2, "causal_mask: expected at least 2 dimensions, got ", describe(x));
  if (x.numel() == 0) return;
  const int64_t rows = x.size(-2), cols = x.size(-1);
  use_device();
  kernels::causal_mask(x.dtype(), x.data(), fill, y.data(), x.numel() / (rows * cols), rows,
                       cols, stream_);
}

// ---- not implemented yet ----------------------------------------------------------------------

void CudaBackend::permute(const Tensor&, const std::vector<int64_t>&, Tensor&) {
  not_implemented("permute");
}
void CudaBackend::copy_narrow(const Tensor&, int64_t, int64_t, Tensor&, int64_t, int64_t) {
  not_implemented("copy_narrow");
}
void CudaBackend::gemm(const GemmDesc&, const Tensor&, const Tensor&, Tensor&) {
  not_implemented("gemm");
}
void CudaBackend::softmax(const Tensor&, Tensor&, bool) { not_implemented("softmax"); }
void CudaBackend::softmax_backward(const Tensor&, const Tensor&, Tensor&, bool) {
  not_implemented("softmax_backward");
}
void CudaBackend::cross_entropy(const Tensor&, const Tensor&, Tensor&, Tensor&) {
  not_implemented("cross_entropy");
}
void CudaBackend::cross_entropy_backward(const Tensor&, const Tensor&, const Tensor&,
                                         const Tensor&, Tensor&) {
  not_implemented("cross_entropy_backward");
}
void CudaBackend::layer_norm(const Tensor&, const Tensor*, const Tensor*, float, Tensor&, Tensor&,
                             Tensor&) {
  not_implemented("layer_norm");
}
void CudaBackend::layer_norm_backward(const Tensor&, const Tensor*, const Tensor&, const Tensor&,
                                      const Tensor&, Tensor&, Tensor*, Tensor*) {
  not_implemented("layer_norm_backward");
}
void CudaBackend::batch_norm(const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&, bool,
                             float, float, Tensor&, Tensor&, Tensor&) {
  not_implemented("batch_norm");
}
void CudaBackend::batch_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                      const Tensor&, bool, Tensor&, Tensor&, Tensor&) {
  not_implemented("batch_norm_backward");
}
void CudaBackend::conv2d(const Tensor&, const Tensor&, const Tensor*, const Conv2dDesc&, Tensor&) {
  not_implemented("conv2d");
}
void CudaBackend::conv2d_backward_data(const Tensor&, const Tensor&, const Conv2dDesc&, Tensor&) {
  not_implemented("conv2d_backward_data");
}
void CudaBackend::conv2d_backward_filter(const Tensor&, const Tensor&, const Conv2dDesc&, Tensor&,
                                         Tensor*) {
  not_implemented("conv2d_backward_filter");
}
void CudaBackend::pool2d(const Pool2dDesc&, const Tensor&, Tensor&, Tensor*) {
  not_implemented("pool2d");
}
void CudaBackend::pool2d_backward(const Pool2dDesc&, const Tensor&, const Tensor*, Tensor&) {
  not_implemented("pool2d_backward");
}
void CudaBackend::embedding(const Tensor&, const Tensor&, Tensor&) { not_implemented("embedding"); }
void CudaBackend::embedding_backward(const Tensor&, const Tensor&, Tensor&) {
  not_implemented("embedding_backward");
}
void CudaBackend::dropout(const Tensor&, float, PhiloxKey, Tensor&) { not_implemented("dropout"); }

// ---- checks -----------------------------------------------------------------------------------

bool CudaBackend::all_finite(const Tensor& x) {
  check_here("all_finite", "x", x);
  if (x.dtype() == DType::I32 || x.numel() == 0) return true;
  use_device();
  Scratch flag(allocator_, sizeof(int32_t));
  kernels::flag_non_finite(x.data(), x.dtype(), x.numel(), static_cast<int32_t*>(flag.get()),
                           stream_);
  int32_t host = 1;
  copy_to_host(&host, flag.get(), sizeof host);
  return host == 0;
}

int64_t CudaBackend::find_out_of_range(const Tensor& ids, int64_t upper) {
  check_here("find_out_of_range", "ids", ids);
  MIXPREC_CHECK(ids.dtype() == DType::I32, "find_out_of_range: ids must be I32, got ",
                describe(ids));
  if (ids.numel() == 0) return -1;
  use_device();
  Scratch first(allocator_, sizeof(unsigned long long));
  kernels::first_out_of_range(static_cast<const int32_t*>(ids.data()), ids.numel(), upper,
                              static_cast<unsigned long long*>(first.get()), stream_);
  unsigned long long host = 0;
  copy_to_host(&host, first.get(), sizeof host);
  return host == std::numeric_limits<unsigned long long>::max() ? -1 : static_cast<int64_t>(host);
}

// ---- mixed precision ---------------------------------------------------------------------------

namespace {

// `t` is an F32 flag tensor of one element: the shared found_inf of the amp primitives.
void check_found_inf(const char* op, const Tensor& t) {
  MIXPREC_CHECK(t.defined(), op, ": found_inf is undefined; pass an F32 [1] tensor");
  MIXPREC_CHECK(t.dtype() == DType::F32 && t.numel() == 1, op, ": found_inf must be F32 [1], got ",
                describe(t));
}

}  // namespace

void CudaBackend::unscale_and_check(const std::vector<Tensor>& grads, double inv_scale,
                                    Tensor& found_inf, Tensor& tensor_flags) {
  constexpr const char* kOp = "unscale_and_check";
  MIXPREC_CHECK(std::isfinite(inv_scale) && inv_scale > 0, kOp,
                ": inv_scale must be finite and positive, got ", inv_scale);
  check_found_inf(kOp, found_inf);
  check_here(kOp, "found_inf", found_inf);
  MIXPREC_CHECK(tensor_flags.defined(), kOp, ": tensor_flags is undefined; pass an I32 [",
                grads.size(), "] tensor");
  check_here(kOp, "tensor_flags", tensor_flags);
  MIXPREC_CHECK(tensor_flags.dtype() == DType::I32 &&
                    tensor_flags.shape() == Shape{static_cast<int64_t>(grads.size())},
                kOp, ": tensor_flags must be I32 [", grads.size(), "] (one flag per gradient), got ",
                describe(tensor_flags));
  std::vector<kernels::TensorRef> refs;
  refs.reserve(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    MIXPREC_CHECK(g.defined(), kOp, ": gradient ", i, " is undefined; pass only defined gradients");
    check_here(kOp, "gradient", g);
    MIXPREC_CHECK(is_floating(g.dtype()), kOp, ": gradient ", i, " is ", describe(g),
                  "; gradients must be F32, F16 or BF16");
    // The kernel writes through the pointer: gradients are updated in place by contract.
    refs.push_back({const_cast<void*>(g.data()), g.numel(), g.dtype()});
  }
  if (grads.empty()) return;

  use_device();
  const kernels::MultiTensorTable table = kernels::make_multi_tensor_table(kOp, refs);
  Scratch device_table(allocator_, table.bytes.size());
  copy_from_host(device_table.get(), table.bytes.data(), table.bytes.size());
  // inv_scale == 1 is a pure check: no store at all, so the bits (NaN payloads included) stay
  // exactly as they were.
  kernels::unscale_and_check(table, device_table.get(), inv_scale, inv_scale != 1.0,
                             static_cast<float*>(found_inf.data()),
                             static_cast<int32_t*>(tensor_flags.data()), stream_);
}

void CudaBackend::squared_norms(const std::vector<Tensor>& xs, Tensor& out) {
  constexpr const char* kOp = "squared_norms";
  MIXPREC_CHECK(out.defined(), kOp, ": out is undefined; pass an F32 [", xs.size(), "] tensor");
  check_here(kOp, "out", out);
  MIXPREC_CHECK(out.dtype() == DType::F32 && out.shape() == Shape{static_cast<int64_t>(xs.size())},
                kOp, ": out must be F32 [", xs.size(), "] (one value per tensor), got ",
                describe(out));
  std::vector<kernels::TensorRef> refs;
  refs.reserve(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    MIXPREC_CHECK(x.defined(), kOp, ": tensor ", i, " is undefined");
    check_here(kOp, "tensor", x);
    MIXPREC_CHECK(is_floating(x.dtype()), kOp, ": tensor ", i, " is ", describe(x),
                  "; only F32, F16 and BF16 tensors are supported");
    refs.push_back({const_cast<void*>(x.data()), x.numel(), x.dtype()});
  }
  if (xs.empty()) return;

  use_device();
  const kernels::MultiTensorTable table = kernels::make_multi_tensor_table(kOp, refs);
  Scratch device_table(allocator_, table.bytes.size());
  copy_from_host(device_table.get(), table.bytes.data(), table.bytes.size());
  Scratch partials(allocator_, static_cast<size_t>(table.chunks) * sizeof(float));
  kernels::squared_norms(table, device_table.get(), static_cast<float*>(partials.get()),
                         static_cast<float*>(out.data()), stream_);
}

// As on the CPU, `working` may be F16, BF16 or an F32 tensor distinct from the master; a
// working copy that shares the master's storage is rejected (the caller passes null when the
// master is its own working copy).
void CudaBackend::sgd_step(const SgdHyper& hyper, Tensor& master, const Tensor& grad,
                           Tensor* momentum, Tensor* working, const Tensor* found_inf) {
  constexpr const char* kOp = "sgd_step";
  MIXPREC_CHECK(master.defined() && grad.defined(), kOp, ": master and grad must be defined");
  check_here(kOp, "master", master);
  check_here(kOp, "grad", grad);
  MIXPREC_CHECK(master.dtype() == DType::F32, kOp, ": the master must be F32, got ",
                describe(master));
  MIXPREC_CHECK(grad.dtype() == DType::F32 && grad.shape() == master.shape(), kOp,
                ": the gradient ", describe(grad), " must be F32 with the master's shape ",
                describe(master));
  const bool use_momentum = hyper.momentum != 0.0f;
  MIXPREC_CHECK(!use_momentum || momentum != nullptr, kOp, ": momentum ", hyper.momentum,
                " needs a momentum buffer (F32, ", describe(master), "); pass one");
  if (momentum != nullptr) {
    MIXPREC_CHECK(momentum->defined(), kOp, ": the momentum buffer is undefined");
    check_here(kOp, "momentum buffer", *momentum);
    MIXPREC_CHECK(momentum->dtype() == DType::F32 && momentum->shape() == master.shape(), kOp,
                  ": the momentum buffer ", describe(*momentum), " must be F32 with the master's "
                  "shape ", describe(master));
  }
  if (working != nullptr) {
    MIXPREC_CHECK(working->defined(), kOp, ": the working copy is undefined; pass null for none");
    check_here(kOp, "working copy", *working);
    MIXPREC_CHECK(is_floating(working->dtype()) && working->shape() == master.shape(), kOp,
                  ": the working copy ", describe(*working), " must be F16, BF16 or F32 with the "
                  "master's shape ", describe(master));
    MIXPREC_CHECK(working->data() != master.data() || master.numel() == 0, kOp,
                  ": the working copy shares the master's storage; pass null when the master is "
                  "its own working copy");
  }
  if (found_inf != nullptr) {
    check_found_inf(kOp, *found_inf);
    check_here(kOp, "found_inf", *found_inf);
  }
  if (master.numel() == 0) return;

  use_device();
  kernels::sgd_step(hyper, static_cast<float*>(master.data()),
                    static_cast<const float*>(grad.data()),
                    use_momentum ? static_cast<float*>(momentum->data()) : nullptr,
                    working != nullptr ? working->data() : nullptr,
                    working != nullptr ? working->dtype() : DType::F32, master.numel(),
                    found_inf != nullptr ? static_cast<const float*>(found_inf->data()) : nullptr,
                    stream_);
}

}  // namespace mixprec
