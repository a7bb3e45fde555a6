// BatchNorm2d: per-channel normalisation over NCHW with running statistics, as
// torch.nn.BatchNorm2d(affine=True, track_running_stats=True).
#pragma once

#include <cstdint>
#include <string>

#include "core/device.h"
#include "layers/module.h"

namespace mixprec {

class BatchNorm2d : public Module {
 public:
  // Parameters `weight` (ones) and `bias` (zeros) [num_features]; buffers `running_mean`
  // (zeros) and `running_var` (ones), F32 [num_features] on `device` whatever the working
  // dtype, and `num_batches_tracked`, a 0-dim I32 counter (torch keeps int64; the value is
  // the same). The counter lives on the CPU on every device: it is host bookkeeping, and
  // incrementing it on a GPU would cost a host round trip per step. Throws for
  // num_features < 1, eps < 0 or momentum outside [0, 1].
  explicit BatchNorm2d(int64_t num_features, Device device = kCPU, double eps = 1e-5,
                       double momentum = 0.1);

  // x [N, num_features, H, W] in the working dtype -> same shape. Training: normalises with
  // the batch statistics, updates the running statistics (momentum, unbiased variance) and
  // increments num_batches_tracked. Eval: normalises with the running statistics.
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;

  // From now on forward returns relu(batch norm) through one fused op (ops::batch_norm2d with
  // relu): the same bits, forward and backward, as this layer followed by ReLU.
  void fuse_relu() { fused_relu_ = true; }
  bool fused_relu() const { return fused_relu_; }

  int64_t num_features() const { return num_features_; }
  const Parameter& weight() const { return weight_; }
  const Parameter& bias() const { return bias_; }
  const Tensor& running_mean() const { return *running_mean_; }
  const Tensor& running_var() const { return *running_var_; }
  int64_t num_batches_tracked() const;
  void set_num_batches_tracked(int64_t count);
  double momentum() const { return momentum_; }
  // Throws for momentum outside [0, 1].
  void set_momentum(double momentum);

 private:
  int64_t num_features_;
  double eps_, momentum_;
  bool fused_relu_ = false;
  Parameter weight_, bias_;
  Tensor* running_mean_;
  Tensor* running_var_;
  Tensor* num_batches_tracked_;
};

}  // namespace mixprec
