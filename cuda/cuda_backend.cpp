// The CUDA backend: memory, launches and validation (core/backend_checks.h, shared with the
// CPU backend). The kernels are in cuda/kernels/, one file per family.
#include "cuda/cuda_backend.h"

#include <cstring>
#include <limits>
#include <type_traits>

#include "core/backend_checks.h"
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
#include "cuda/kernels/param_steps.h"
#include "cuda/kernels/random.h"

namespace mixprec {
namespace {

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
  // Statuses are ignored: at process exit the runtime may already be unloading. The stream is
  // synchronised before anything is destroyed: upload_ring_, destroyed after this body, then
  // has no copy left that reads its pinned memory.
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
  backend_checks::on_device(op, what, t, device());
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

void* CudaBackend::allocate(size_t nbytes) {
  const auto passage = capture_gate_.pass();
  return allocator_.allocate(nbytes);
}

void CudaBackend::deallocate(void* ptr, size_t) noexcept {
  const auto passage = capture_gate_.pass();
  allocator_.deallocate(ptr);
}

void CudaBackend::copy_from_host(void* dst, const void* host_src, size_t nbytes) {
  if (nbytes == 0) return;
  // Another thread's upload waits for a capture to end; the capturing thread's is refused.
  const auto passage = capture_gate_.pass();
  use_device();
  // A captured copy would read its staging region (or host_src itself) at each replay, long
  // after the caller reused it: refused, so that a CUDA graph (cuda_graph.h) never replays
  // stale bytes.
  MIXPREC_CHECK(!capturing(),
                "cuda: copy from the host while the stream is being captured into a CUDA "
                "graph; upload before the capture, into tensors the graph reads");
  const std::lock_guard<std::mutex> lock(upload_mutex_);
  // The ring copies host_src before it returns, so the caller may reuse it at once; its waits
  // for space are host syncs, counted even when the upload then fails.
  const uint64_t waits_before = upload_ring_.waits();
  try {
    upload_ring_.upload(dst, host_src, nbytes, stream_);
  } catch (...) {
    host_syncs_.fetch_add(upload_ring_.waits() - waits_before, std::memory_order_relaxed);
    throw;
  }
  host_syncs_.fetch_add(upload_ring_.waits() - waits_before, std::memory_order_relaxed);
}

bool CudaBackend::capturing() const {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
  return capture != cudaStreamCaptureStatusNone;
}

void CudaBackend::upload_table(void* dst, const void* bytes, size_t n) {
  if (n == 0) return;
  if (!capturing()) {
    copy_from_host(dst, bytes, n);
    return;
  }
  use_device();
  capture_staging_.upload(dst, bytes, n, stream_);
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

PhiloxKey CudaBackend::mask_key(PhiloxKey key, float p) const {
  // A mask that drops nothing draws no numbers (the attention softmax without dropout gets
  // an empty key), so there is nothing for a replay to move.
  if (dropout_base_ == nullptr || p == 0.0f) return key;
  MIXPREC_CHECK(key.offset >= dropout_host_base_, "cuda: a dropout key at offset ", key.offset,
                " precedes the base ", dropout_host_base_, " of the step being recorded");
  return PhiloxKey{key.seed, key.offset - dropout_host_base_, dropout_base_};
}

void CudaBackend::check_fill_key(const char* op) const {
  MIXPREC_CHECK(dropout_base_ == nullptr, "cuda: ", op, " while a training step is recorded: ",
                "its random key would be replayed unchanged at every replay");
}

void CudaBackend::random_uniform(Tensor& out, PhiloxKey key, float low, float high) {
  check_here("random_uniform", "out", out);
  check_fill_key("random_uniform");
  use_device();
  kernels::random_uniform(out.data(), out.dtype(), out.numel(), key, low, high, stream_);
}

void CudaBackend::random_normal(Tensor& out, PhiloxKey key, float mean, float stddev) {
  check_here("random_normal", "out", out);
  check_fill_key("random_normal");
  use_device();
  kernels::random_normal(out.data(), out.dtype(), out.numel(), key, mean, stddev, stream_);
}

void CudaBackend::cast(const Tensor& x, Tensor& y) {
  backend_checks::cast(device(), x, y);
  if (x.dtype() == y.dtype()) return copy(x, y);
  use_device();
  kernels::cast(x.data(), x.dtype(), y.data(), y.dtype(), x.numel(), stream_);
}

void CudaBackend::copy(const Tensor& x, Tensor& y) {
  backend_checks::copy(device(), x, y);
  if (x.numel() == 0 || x.data() == y.data()) return;
  use_device();
  CUDA_CHECK(cudaMemcpyAsync(y.data(), x.data(), x.nbytes(), cudaMemcpyDeviceToDevice, stream_));
}

// ---- elementwise ----------------------------------------------------------------------------

void CudaBackend::unary(UnaryOp op, const Tensor& x, Tensor& y) {
  backend_checks::unary(device(), x, y);
  use_device();
  kernels::unary(op, x.dtype(), x.data(), y.data(), x.numel(), stream_);
}

void CudaBackend::unary_backward(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& dy,
                                 Tensor& dx) {
  backend_checks::unary_backward(device(), x, y, dy, dx);
  use_device();
  kernels::unary_backward(op, x.dtype(), x.data(), y.data(), dy.data(), dx.data(), x.numel(),
                          stream_);
}

void CudaBackend::affine(const Tensor& x, float alpha, float beta, Tensor& y) {
  backend_checks::affine(device(), x, y);
  use_device();
  kernels::affine(x.dtype(), x.data(), alpha, beta, y.data(), x.numel(), stream_);
}

void CudaBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  backend_checks::binary(device(), a, b, out);
  if (out.numel() == 0) return;
  use_device();
  kernels::binary(op, out.dtype(), a.data(), a.shape(), b.data(), b.shape(), out.data(),
                  out.shape(), stream_);
}

void CudaBackend::sum_to(const Tensor& x, Tensor& y, float scale) {
  backend_checks::sum_to(device(), x, y);
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
  backend_checks::expand(device(), x, y);
  if (y.numel() == 0) return;
  use_device();
  kernels::expand(x.dtype(), x.data(), x.shape(), y.data(), y.shape(), scale, stream_);
}

void CudaBackend::causal_mask(const Tensor& x, float fill, Tensor& y) {
  const backend_checks::Rows dims = backend_checks::causal_mask(device(), x, y);
  if (x.numel() == 0) return;
  const int64_t rows = dims.rows, cols = dims.cols;
  use_device();
  kernels::causal_mask(x.dtype(), x.data(), fill, y.data(), x.numel() / (rows * cols), rows,
                       cols, stream_);
}

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

// The multi-tensor table's view of `ts`. The kernels that write do so through these pointers:
// the tensors are updated in place by contract.
std::vector<kernels::TensorRef> tensor_refs(const std::vector<Tensor>& ts) {
  std::vector<kernels::TensorRef> refs;
  refs.reserve(ts.size());
  for (const Tensor& t : ts) refs.push_back({const_cast<void*>(t.data()), t.numel(), t.dtype()});
  return refs;
}

}  // namespace

void CudaBackend::unscale_grads(const char* op, const std::vector<Tensor>& grads,
                                double inv_scale, const Tensor* scale_state, Tensor& found_inf,
                                Tensor& tensor_flags) {
  if (grads.empty()) return;
  use_device();
  const kernels::MultiTensorTable table = kernels::make_multi_tensor_table(op, tensor_refs(grads));
  Scratch device_table(allocator_, table.bytes.size());
  upload_table(device_table.get(), table.bytes.data(), table.bytes.size());
  float* found = static_cast<float*>(found_inf.data());
  int32_t* flags = static_cast<int32_t*>(tensor_flags.data());
  if (scale_state != nullptr) {
    kernels::unscale_and_check_on_device(table, device_table.get(),
                                         static_cast<const int32_t*>(scale_state->data()), found,
                                         flags, stream_);
    return;
  }
  // inv_scale == 1 is a pure check: no store at all, so the bits (NaN payloads included) stay
  // exactly as they were.
  kernels::unscale_and_check(table, device_table.get(), inv_scale, inv_scale != 1.0, found, flags,
                             stream_);
}

void CudaBackend::unscale_and_check(const std::vector<Tensor>& grads, double inv_scale,
                                    Tensor& found_inf, Tensor& tensor_flags) {
  backend_checks::unscale_and_check(device(), grads, inv_scale, found_inf, tensor_flags);
  unscale_grads("unscale_and_check", grads, inv_scale, nullptr, found_inf, tensor_flags);
}

void CudaBackend::widen_gradients(const std::vector<GradientWidening>& items) {
  backend_checks::widen_gradients(device(), items);
  if (items.empty()) return;
  use_device();
  std::vector<kernels::TensorRef> sources;
  std::vector<kernels::WidenTarget> targets;
  sources.reserve(items.size());
  targets.reserve(items.size());
  for (const GradientWidening& item : items) {
    const Tensor& source = *item.source;
    sources.push_back({const_cast<void*>(source.data()), source.numel(), source.dtype()});
    targets.push_back({item.destination->data_as<float>(), item.accumulate ? 1 : 0});
  }
  const kernels::MultiTensorTable table =
      kernels::make_multi_tensor_table("widen_gradients", sources);
  if (table.chunks == 0) return;
  // The table and its targets in one upload.
  const size_t targets_offset = kernels::widen_targets_offset(table);
  std::vector<unsigned char> block(targets_offset + targets.size() * sizeof(kernels::WidenTarget));
  std::memcpy(block.data(), table.bytes.data(), table.bytes.size());
  std::memcpy(block.data() + targets_offset, targets.data(),
              targets.size() * sizeof(kernels::WidenTarget));
  Scratch device_block(allocator_, block.size());
  upload_table(device_block.get(), block.data(), block.size());
  kernels::widen_gradients(table, device_block.get(), stream_);
}

void CudaBackend::squared_norms(const std::vector<Tensor>& xs, Tensor& out) {
  constexpr const char* kOp = "squared_norms";
  backend_checks::squared_norms(device(), xs, out);
  if (xs.empty()) return;

  use_device();
  const kernels::MultiTensorTable table = kernels::make_multi_tensor_table(kOp, tensor_refs(xs));
  Scratch device_table(allocator_, table.bytes.size());
  upload_table(device_table.get(), table.bytes.data(), table.bytes.size());
  Scratch partials(allocator_, static_cast<size_t>(table.chunks) * sizeof(float));
  kernels::squared_norms(table, device_table.get(), static_cast<float*>(partials.get()),
                         static_cast<float*>(out.data()), stream_);
}

void CudaBackend::update_loss_scale(const DynamicScaleRule& rule, Tensor& state,
                                    const Tensor& found_inf) {
  backend_checks::update_loss_scale(device(), rule, state, found_inf);
  use_device();
  kernels::update_loss_scale(rule, static_cast<int32_t*>(state.data()),
                             static_cast<const float*>(found_inf.data()), stream_);
}

// ---- deferred steps ----------------------------------------------------------------------------

void CudaBackend::loss_scale_factor(const Tensor& scale_state, double weight, Tensor& out) {
  backend_checks::loss_scale_factor(device(), scale_state, weight, out);
  use_device();
  kernels::loss_scale_factor(static_cast<const int32_t*>(scale_state.data()), weight,
                             static_cast<float*>(out.data()), stream_);
}

void CudaBackend::unscale_and_check_on_device(const std::vector<Tensor>& grads,
                                              const Tensor& scale_state, Tensor& found_inf,
                                              Tensor& tensor_flags) {
  backend_checks::unscale_and_check_on_device(device(), grads, scale_state, found_inf,
                                              tensor_flags);
  unscale_grads("unscale_and_check_on_device", grads, 1.0, &scale_state, found_inf, tensor_flags);
}

void CudaBackend::clip_by_total_norm(const std::vector<Tensor>& grads, const Tensor& squared_sums,
                                     double max_norm, Tensor& norm_out) {
  constexpr const char* kOp = "clip_by_total_norm";
  backend_checks::clip_by_total_norm(device(), grads, squared_sums, max_norm, norm_out);
  use_device();
  const kernels::MultiTensorTable table = kernels::make_multi_tensor_table(kOp, tensor_refs(grads));
  // The table is uploaded only when there is something to scale; the norm is written anyway.
  const size_t table_bytes = table.chunks > 0 ? table.bytes.size() : 0;
  Scratch device_table(allocator_, table_bytes);
  upload_table(device_table.get(), table.bytes.data(), table_bytes);
  Scratch coef(allocator_, sizeof(double));
  kernels::clip_by_total_norm(table, device_table.get(),
                              static_cast<const float*>(squared_sums.data()), max_norm,
                              static_cast<float*>(norm_out.data()),
                              static_cast<double*>(coef.get()), stream_);
}

void CudaBackend::count_taken_step(const Tensor& found_inf, Tensor& taken) {
  backend_checks::count_taken_step(device(), found_inf, taken);
  use_device();
  kernels::count_taken_step(static_cast<const float*>(found_inf.data()),
                            static_cast<int32_t*>(taken.data()), stream_);
}

// ---- multi-tensor optimizer steps -------------------------------------------------------------

namespace {

kernels::ParamStepBuffers step_buffers(const Tensor& master, const Tensor& grad,
                                       const Tensor* state0, const Tensor* state1,
                                       const Tensor* working) {
  kernels::ParamStepBuffers b;
  // The kernel writes through these pointers: the tensors are updated in place by contract.
  b.master = static_cast<float*>(const_cast<void*>(master.data()));
  b.grad = static_cast<const float*>(grad.data());
  if (state0 != nullptr) b.state0 = static_cast<float*>(const_cast<void*>(state0->data()));
  if (state1 != nullptr) b.state1 = static_cast<float*>(const_cast<void*>(state1->data()));
  if (working != nullptr) {
    b.working = const_cast<void*>(working->data());
    b.working_dtype = static_cast<int32_t>(working->dtype());
  }
  b.numel = master.numel();
  return b;
}

// The table of `steps`: each step's base hyper, its rates (its table's entries, or the one
// entry of an immediate step's own hyper) and the buffers `buffers_of` gives it.
template <class Source, class ParamStep, class BuffersOf>
kernels::ParamStepTable step_table(const char* op, const std::vector<ParamStep>& steps,
                                   BuffersOf buffers_of) {
  std::vector<std::remove_cv_t<std::remove_pointer_t<decltype(Source::rates)>>> own(steps.size());
  std::vector<Source> sources(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    const ParamStep& step = steps[i];
    Source& source = sources[i];
    source.hyper = step.hyper;
    if (step.table != nullptr) {
      source.rates = step.table->entry;
      source.rates_count = step.table->count;
    } else {
      own[i] = rates_of(step.hyper);
      source.rates = &own[i];
      source.rates_count = 1;
    }
    source.buffers = buffers_of(step);
  }
  return kernels::make_param_step_table(op, sources);
}

}  // namespace

void CudaBackend::adam_steps(const std::vector<AdamParamStep>& steps, const Tensor* taken,
                             const Tensor* found_inf) {
  backend_checks::adam_steps(device(), steps, taken, found_inf);
  launch_adam_steps("adam_steps", steps, taken, found_inf);
}

void CudaBackend::sgd_steps(const std::vector<SgdParamStep>& steps, const Tensor* taken,
                            const Tensor* found_inf) {
  backend_checks::sgd_steps(device(), steps, taken, found_inf);
  launch_sgd_steps("sgd_steps", steps, taken, found_inf);
}

void CudaBackend::launch_adam_steps(const char* op, const std::vector<AdamParamStep>& steps,
                                    const Tensor* taken, const Tensor* found_inf) {
  const kernels::ParamStepTable table = step_table<kernels::AdamStepSource>(
      op, steps, [](const AdamParamStep& s) {
        return step_buffers(*s.master, *s.grad, s.exp_avg, s.exp_avg_sq, s.working);
      });
  launch_param_steps(table, &kernels::adam_steps, taken, found_inf);
}

void CudaBackend::launch_sgd_steps(const char* op, const std::vector<SgdParamStep>& steps,
                                   const Tensor* taken, const Tensor* found_inf) {
  const kernels::ParamStepTable table = step_table<kernels::SgdStepSource>(
      op, steps, [](const SgdParamStep& s) {
        // Without momentum a buffer, if given, is not the kernel's business.
        const Tensor* momentum = s.hyper.momentum != 0.0f ? s.momentum : nullptr;
        return step_buffers(*s.master, *s.grad, momentum, nullptr, s.working);
      });
  launch_param_steps(table, &kernels::sgd_steps, taken, found_inf);
}

void CudaBackend::launch_param_steps(const kernels::ParamStepTable& table,
                                     ParamStepsLaunch launch, const Tensor* taken,
                                     const Tensor* found_inf) {
  if (table.chunks == 0) return;
  use_device();
  Scratch device_table(allocator_, table.bytes.size());
  upload_table(device_table.get(), table.bytes.data(), table.bytes.size());
  launch(table, device_table.get(),
         taken != nullptr ? static_cast<const int32_t*>(taken->data()) : nullptr,
         found_inf != nullptr ? static_cast<const float*>(found_inf->data()) : nullptr, stream_);
}

}  // namespace mixprec
