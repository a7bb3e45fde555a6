// Linear: y = x W^T + b over the last dimension, as torch.nn.Linear.
#pragma once

#include <cstdint>
#include <string>

#include "core/device.h"
#include "core/generator.h"
#include "layers/module.h"

namespace mixprec {

class Linear : public Module {
 public:
  // Parameters `weight` [out_features, in_features] and, when `bias`, `bias` [out_features],
  // both drawn (weight first) from U(-1/sqrt(in_features), 1/sqrt(in_features)): torch's
  // default (kaiming_uniform(a = sqrt(5)) gives that bound for the weight). Throws for an
  // extent < 1.
  Linear(int64_t in_features, int64_t out_features, bool bias, Generator& init,
         Device device = kCPU);
  // Weight tying: a Linear without bias whose `weight` is `weight` itself (same Parameter,
  // registered under this module's name too), e.g. GPT's lm_head sharing the token embedding.
  // `weight` must be 2-D [out_features, in_features].
  explicit Linear(const Parameter& weight);

  // Makes forward return gelu of the output, in one op (ops::linear_gelu), for a GELU module
  // that follows this one and passes its input through (GELU(true)).
  void fuse_gelu();

  // x [..., in_features] in the working dtype -> [..., out_features].
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;

  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  const Parameter& weight() const { return weight_; }
  const Parameter& bias() const { return bias_; }  // undefined without bias

 private:
  int64_t in_features_ = 0, out_features_ = 0;
  Parameter weight_, bias_;
  bool fused_gelu_ = false;
};

}  // namespace mixprec
