// The CPU backend: Eigen GEMM, im2col convolution, OpenMP loops. It is the reference that
// the CUDA backend is tested against, so its rounding points (FP32 compute, one rounding on
// store) are the contract. Methods are defined across core/cpu/*.cpp by family.
#pragma once

#include "core/backend.h"

namespace mixprec {

class CpuBackend final : public Backend {
 public:
  Device device() const override { return kCPU; }
  std::string name() const override { return "cpu"; }

  // cpu_memory.cpp. 64-byte aligned; large buffers are recycled through the cache of
  // core/cpu/buffer_cache.h, so deallocate must get the nbytes that allocate was given.
  void* allocate(size_t nbytes) override;
  void deallocate(void* ptr, size_t nbytes) noexcept override;
  void copy_from_host(void* dst, const void* host_src, size_t nbytes) override;
  void copy_to_host(void* host_dst, const void* src, size_t nbytes) override;
  void fill(Tensor& out, double value) override;
  void arange(Tensor& out, double start, double step) override;
  void random_uniform(Tensor& out, PhiloxKey key, float low, float high) override;
  void random_normal(Tensor& out, PhiloxKey key, float mean, float stddev) override;
  void cast(const Tensor& x, Tensor& y) override;
  void copy(const Tensor& x, Tensor& y) override;
  void widen_gradients(const std::vector<GradientWidening>& items) override;
  bool all_finite(const Tensor& x) override;
  int64_t find_out_of_range(const Tensor& ids, int64_t upper) override;

  // cpu_elementwise.cpp
  void unary(UnaryOp op, const Tensor& x, Tensor& y) override;
  void unary_backward(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& dy,
                      Tensor& dx) override;
  void affine(const Tensor& x, float alpha, float beta, Tensor& y) override;
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) override;
  void sum_to(const Tensor& x, Tensor& y, float scale) override;
  void expand(const Tensor& x, Tensor& y, float scale) override;
  void causal_mask(const Tensor& x, float fill, Tensor& y) override;

  // cpu_layout.cpp
  void permute(const Tensor& x, const std::vector<int64_t>& perm, Tensor& y) override;
  void copy_narrow(const Tensor& src, int64_t dim, int64_t src_start, Tensor& dst,
                   int64_t dst_start, int64_t length) override;
  void split_heads(const Tensor& qkv, Tensor& q, Tensor& k, Tensor& v) override;
  void merge_heads(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& qkv) override;

  // cpu_gemm.cpp
  void gemm(const GemmDesc& desc, const Tensor& a, const Tensor& b, Tensor& c) override;
  void gemm_epilogue(const GemmDesc& desc, GemmEpilogue epilogue, const Tensor& a,
                     const Tensor& b, const Tensor* bias, Tensor& c, Tensor* pre_gelu) override;

  // cpu_conv.cpp, cpu_pool.cpp
  void conv2d(const Tensor& x, const Tensor& w, const Tensor* bias, const Conv2dDesc& desc,
              Tensor& y) override;
  void conv2d_backward_data(const Tensor& dy, const Tensor& w, const Conv2dDesc& desc,
                            Tensor& dx) override;
  void conv2d_backward_filter(const Tensor& x, const Tensor& dy, const Conv2dDesc& desc,
                              Tensor& dw, Tensor* dbias) override;
  void pool2d(const Pool2dDesc& desc, const Tensor& x, Tensor& y, Tensor* argmax) override;
  void pool2d_backward(const Pool2dDesc& desc, const Tensor& dy, const Tensor* argmax,
                       Tensor& dx) override;

  // cpu_softmax.cpp, cpu_norm.cpp, cpu_embedding.cpp
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
  void embedding(const Tensor& weight, const Tensor& ids, Tensor& y) override;
  void embedding_backward(const Tensor& ids, const Tensor& dy, Tensor& dweight) override;
  void dropout(const Tensor& x, float p, PhiloxKey key, Tensor& y) override;
  void dropout_add(const Tensor& residual, const Tensor& x, float p, PhiloxKey key,
                   Tensor& y) override;

  // cpu_amp.cpp
  void unscale_and_check(const std::vector<Tensor>& grads, double inv_scale, Tensor& found_inf,
                         Tensor& tensor_flags) override;
  void squared_norms(const std::vector<Tensor>& xs, Tensor& out) override;
  void update_loss_scale(const DynamicScaleRule& rule, Tensor& state,
                         const Tensor& found_inf) override;
  // The counter and the scale state are plain host memory here, read directly.
  void loss_scale_factor(const Tensor& scale_state, double weight, Tensor& out) override;
  void unscale_and_check_on_device(const std::vector<Tensor>& grads, const Tensor& scale_state,
                                   Tensor& found_inf, Tensor& tensor_flags) override;
  void clip_by_total_norm(const std::vector<Tensor>& grads, const Tensor& squared_sums,
                          double max_norm, Tensor& norm_out) override;
  void count_taken_step(const Tensor& found_inf, Tensor& taken) override;
  // The per-parameter updates in order, after one validation of the whole call.
  void adam_steps(const std::vector<AdamParamStep>& steps, const Tensor* taken,
                  const Tensor* found_inf) override;
  void sgd_steps(const std::vector<SgdParamStep>& steps, const Tensor* taken,
                 const Tensor* found_inf) override;
};

}  // namespace mixprec
