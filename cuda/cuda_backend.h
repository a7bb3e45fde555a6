// The CUDA backend: the Backend primitives on one NVIDIA GPU, with the CPU backend's
// semantics (FP16/BF16 loaded, computed in FP32, rounded once on store), so the CPU backend
// is its test oracle. Internal to cuda/ (it includes CUDA headers); apps reach it through
// cuda/register.h.
//
// - One compute stream, created non-blocking: every kernel and copy of the backend is
//   queued on it, so work is ordered without events and the caching allocator can reuse a
//   freed block at once (see cuda/caching_allocator.h). Code that uses the backend's memory
//   on another stream must synchronise with stream() first.
// - Device memory comes from a CachingAllocator: no cudaMalloc in the steady state.
// - cuBLASLt and cuDNN handles are created on first use and bound to the stream.
// - Host synchronisations are counted: copy_to_host and synchronize (and so every primitive
//   that returns a value to the host: all_finite, find_out_of_range) add one each, so a
//   training loop can report syncs per step. Launches do not wait for the device and are not
//   counted.
// - copy_from_host stages the bytes through a ring of pinned host memory
//   (cuda/pinned_upload.h), so the copy is queued without waiting for the stream; it counts
//   one host sync only when the ring must wait for an earlier upload's region to be read.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "core/backend.h"
#include "cuda/caching_allocator.h"
#include "cuda/capture_gate.h"
#include "cuda/capture_staging.h"
#include "cuda/pinned_upload.h"

namespace mixprec {

namespace kernels {
struct ParamStepTable;
}  // namespace kernels

class CudaBackend final : public Backend {
 public:
  // Takes device `device_index` and creates the stream; throws mixprec::Error when the
  // device cannot be used.
  explicit CudaBackend(int device_index = 0);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Device device() const override { return cuda_device(device_index_); }
  std::string name() const override { return "cuda"; }

  cudaStream_t stream() const { return stream_; }
  cublasLtHandle_t cublaslt_handle();
  cudnnHandle_t cudnn_handle();
  CachingAllocator& allocator() { return allocator_; }
  const CachingAllocator& allocator() const { return allocator_; }
  // The ring that copy_from_host stages through, for its counters in tests and logs. Not
  // synchronised: read it while no upload is running.
  const PinnedUploadRing& upload_ring() const { return upload_ring_; }
  // How often the host waited for the device so far: copy_to_host and synchronize calls, and
  // the upload ring's waits for space.
  uint64_t host_syncs() const { return host_syncs_.load(std::memory_order_relaxed); }

  // ---- memory ---------------------------------------------------------------------------
  void* allocate(size_t nbytes) override;
  void deallocate(void* ptr, size_t nbytes) noexcept override;
  // Staged through the upload ring and queued on the stream; the host buffer may be reused as
  // soon as the call returns. Safe to call from any thread.
  void copy_from_host(void* dst, const void* host_src, size_t nbytes) override;
  // Waits for the stream (the data is then on the host); counts one host sync.
  void copy_to_host(void* host_dst, const void* src, size_t nbytes) override;
  // Waits for the stream; counts one host sync.
  void synchronize() override;
  // CUDA graphs in one private pool of this backend's allocator (cuda/cuda_graph.h).
  std::unique_ptr<StepGraphs> make_step_graphs() override;
  // Whether the stream is being captured into a CUDA graph (cuda/cuda_graph.h) now.
  bool capturing() const;
  // Closed by a CudaGraph for its capture: meanwhile allocate, deallocate and copy_from_host
  // called from other threads wait (cuda/capture_gate.h).
  CaptureGate& capture_gate() { return capture_gate_; }
  // The pinned buffers of the tables staged during the capture that just ended, for its graph
  // to keep (cuda/capture_staging.h).
  std::vector<void*> take_capture_staging() { return capture_staging_.take(); }
  // While set (a step being recorded, cuda/cuda_graph.cpp), dropout masks are keyed relative
  // to `host_base`: a key's offset becomes offset - host_base on top of the device value at
  // `device_base` (PhiloxKey::base), which each replay sets to its own step's offset. Random
  // fills are refused meanwhile. Null `device_base` ends it.
  void set_relative_dropout_keys(const uint64_t* device_base, uint64_t host_base) {
    dropout_base_ = device_base;
    dropout_host_base_ = host_base;
  }

  // ---- fills, casts, copies -------------------------------------------------------------
  void fill(Tensor& out, double value) override;
  void arange(Tensor& out, double start, double step) override;
  void random_uniform(Tensor& out, PhiloxKey key, float low, float high) override;
  void random_normal(Tensor& out, PhiloxKey key, float mean, float stddev) override;
  void cast(const Tensor& x, Tensor& y) override;
  void copy(const Tensor& x, Tensor& y) override;
  void widen_gradients(const std::vector<GradientWidening>& items) override;

  // ---- elementwise ------------------------------------------------------------------------
  void unary(UnaryOp op, const Tensor& x, Tensor& y) override;
  void unary_backward(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& dy,
                      Tensor& dx) override;
  void affine(const Tensor& x, float alpha, float beta, Tensor& y) override;
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) override;
  void sum_to(const Tensor& x, Tensor& y, float scale) override;
  void expand(const Tensor& x, Tensor& y, float scale) override;
  void causal_mask(const Tensor& x, float fill, Tensor& y) override;

  // ---- layout -----------------------------------------------------------------------------
  void permute(const Tensor& x, const std::vector<int64_t>& perm, Tensor& y) override;
  void copy_narrow(const Tensor& src, int64_t dim, int64_t src_start, Tensor& dst,
                   int64_t dst_start, int64_t length) override;
  void split_heads(const Tensor& qkv, Tensor& q, Tensor& k, Tensor& v) override;
  void merge_heads(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& qkv) override;

  // ---- GEMM and neural-network primitives ------------------------------------------------------
  void gemm(const GemmDesc& desc, const Tensor& a, const Tensor& b, Tensor& c) override;
  // The fused cuBLASLt epilogue (BIAS; GELU_AUX and GELU_AUX_BIAS for 16-bit outputs with
  // rows a multiple of 8 long) where cuBLASLt offers an algorithm for it; otherwise the
  // product into FP32 and kernels::gemm_epilogue, with the same stores (cuda_gemm.cpp).
  void gemm_epilogue(const GemmDesc& desc, GemmEpilogue epilogue, const Tensor& a,
                     const Tensor& b, const Tensor* bias, Tensor& c, Tensor* pre_gelu) override;
  void softmax(const Tensor& x, Tensor& y, bool log) override;
  void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx, bool log) override;
  void attention_softmax(const Tensor& scores, float p, PhiloxKey key, Tensor& probs,
                         Tensor& operand) override;
  void attention_softmax_backward(const Tensor& probs, const Tensor& dprobs, float p,
                                  PhiloxKey key, Tensor& ds) override;
  void cross_entropy(const Tensor& logits, const Tensor& labels, Tensor& loss,
                     Tensor& row_stats) override;
  void cross_entropy_backward(const Tensor& logits, const Tensor& labels,
                              const Tensor& row_stats, const Tensor& dloss,
                              Tensor& dlogits) override;
  void layer_norm(const Tensor& x, const Tensor* weight, const Tensor* bias, float eps,
                  Tensor& y, Tensor& mean, Tensor& rstd) override;
  void layer_norm_backward(const Tensor& x, const Tensor* weight, const Tensor& mean,
                           const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor* dweight,
                           Tensor* dbias) override;
  void batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                  Tensor& running_mean, Tensor& running_var, bool training, float momentum,
                  float eps, bool relu, Tensor& y, Tensor& save_mean,
                  Tensor& save_invstd) override;
  void batch_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& save_mean,
                           const Tensor& save_invstd, const Tensor& dy, bool training,
                           const Tensor* relu_bias, Tensor& dx, Tensor& dweight,
                           Tensor& dbias) override;
  void conv2d(const Tensor& x, const Tensor& w, const Tensor* bias, const Conv2dDesc& desc,
              Tensor& y) override;
  void conv2d_backward_data(const Tensor& dy, const Tensor& w, const Conv2dDesc& desc,
                            Tensor& dx) override;
  void conv2d_backward_filter(const Tensor& x, const Tensor& dy, const Conv2dDesc& desc,
                              Tensor& dw, Tensor* dbias) override;
  void pool2d(const Pool2dDesc& desc, const Tensor& x, Tensor& y, Tensor* argmax) override;
  void pool2d_backward(const Pool2dDesc& desc, const Tensor& dy, const Tensor* argmax,
                       Tensor& dx) override;
  void embedding(const Tensor& weight, const Tensor& ids, Tensor& y) override;
  void embedding_backward(const Tensor& ids, const Tensor& dy, Tensor& dweight) override;
  void dropout(const Tensor& x, float p, PhiloxKey key, Tensor& y) override;
  void dropout_add(const Tensor& residual, const Tensor& x, float p, PhiloxKey key,
                   Tensor& y) override;

  // ---- checks (each reads one value back: one host sync) ----------------------------------
  bool all_finite(const Tensor& x) override;
  int64_t find_out_of_range(const Tensor& ids, int64_t upper) override;

  // ---- mixed precision (no host sync) -----------------------------------------------------
  void unscale_and_check(const std::vector<Tensor>& grads, double inv_scale, Tensor& found_inf,
                         Tensor& tensor_flags) override;
  void squared_norms(const std::vector<Tensor>& xs, Tensor& out) override;
  void update_loss_scale(const DynamicScaleRule& rule, Tensor& state,
                         const Tensor& found_inf) override;

  // ---- deferred steps (no host sync) --------------------------------------------------------
  void loss_scale_factor(const Tensor& scale_state, double weight, Tensor& out) override;
  void unscale_and_check_on_device(const std::vector<Tensor>& grads, const Tensor& scale_state,
                                   Tensor& found_inf, Tensor& tensor_flags) override;
  void clip_by_total_norm(const std::vector<Tensor>& grads, const Tensor& squared_sums,
                          double max_norm, Tensor& norm_out) override;
  void count_taken_step(const Tensor& found_inf, Tensor& taken) override;

  // ---- optimizer steps (no host sync): one upload of the step table through the pinned
  // ring, one launch for every parameter. -------------------------------------------------
  void adam_steps(const std::vector<AdamParamStep>& steps, const Tensor* taken,
                  const Tensor* found_inf) override;
  void sgd_steps(const std::vector<SgdParamStep>& steps, const Tensor* taken,
                 const Tensor* found_inf) override;

 private:
  // `t` is defined and lives on this backend's device; the message names op and `what`.
  void check_here(const char* op, const char* what, const Tensor& t) const;
  // The unscale pass of both unscale primitives, after validation: by the host's inv_scale,
  // or by 1 / S read on the device from scale_state when that is not null.
  void unscale_grads(const char* op, const std::vector<Tensor>& grads, double inv_scale,
                     const Tensor* scale_state, Tensor& found_inf, Tensor& tensor_flags);
  // The launches of adam_steps / sgd_steps, after validation.
  void launch_adam_steps(const char* op, const std::vector<AdamParamStep>& steps,
                         const Tensor* taken, const Tensor* found_inf);
  void launch_sgd_steps(const char* op, const std::vector<SgdParamStep>& steps,
                        const Tensor* taken, const Tensor* found_inf);
  // Uploads `table` and runs `launch` (kernels::adam_steps or sgd_steps) on it.
  using ParamStepsLaunch = void (*)(const kernels::ParamStepTable&, const void*, const int32_t*,
                                    const float*, cudaStream_t);
  void launch_param_steps(const kernels::ParamStepTable& table, ParamStepsLaunch launch,
                          const Tensor* taken, const Tensor* found_inf);
  // Copies a multi-tensor table of n bytes to device memory `dst` ahead of the launches that
  // read it: through the upload ring, or, while the stream is being captured, from pinned
  // memory that the graph keeps, so that every replay reads the same bytes.
  void upload_table(void* dst, const void* bytes, size_t n);
  // `key` as the kernels get it: relative to the device base while one is set (above), unless
  // the drop probability `p` is 0.
  PhiloxKey mask_key(PhiloxKey key, float p) const;
  // Throws while dropout keys are relative: a random fill's key would be baked into a graph.
  void check_fill_key(const char* op) const;
  // Makes this backend's device current for the calling thread (the CUDA runtime keeps it
  // per thread); every primitive calls it before touching the stream.
  void use_device() const;

  const int device_index_;
  cudaStream_t stream_ = nullptr;
  CachingAllocator allocator_;
  std::mutex handles_mutex_;
  cublasLtHandle_t cublaslt_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  std::atomic<uint64_t> host_syncs_{0};
  // Serialises uploads: batches may be uploaded from another thread (a data prefetcher). The
  // ring is destroyed after the destructor's body, which has synchronised the stream, so no
  // region is still being read when its pinned memory is freed.
  std::mutex upload_mutex_;
  PinnedUploadRing upload_ring_;
  CaptureStaging capture_staging_;
  CaptureGate capture_gate_;
  const uint64_t* dropout_base_ = nullptr;
  uint64_t dropout_host_base_ = 0;
};

}  // namespace mixprec
