// Conv2d: a square-kernel 2-D convolution over NCHW, as torch.nn.Conv2d (groups 1,
// dilation 1, zero padding).
#pragma once

#include <cstdint>
#include <string>

#include "core/device.h"
#include "core/generator.h"
#include "layers/module.h"

namespace mixprec {

class Conv2d : public Module {
 public:
  // Parameters `weight` [out_channels, in_channels, kernel, kernel] and, when `bias`, `bias`
  // [out_channels], both drawn (weight first) from U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with
  // fan_in = in_channels * kernel * kernel: torch's default. Throws for channels or kernel
  // < 1, stride < 1 or padding < 0.
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride, int64_t padding,
         bool bias, Generator& init, Device device = kCPU);

  // x [N, in_channels, H, W] in the working dtype -> [N, out_channels, H', W'] with
  // H' = (H + 2 padding - kernel) / stride + 1.
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;

  int64_t in_channels() const { return in_channels_; }
  int64_t out_channels() const { return out_channels_; }
  int64_t kernel() const { return kernel_; }
  int64_t stride() const { return stride_; }
  int64_t padding() const { return padding_; }
  const Parameter& weight() const { return weight_; }
  const Parameter& bias() const { return bias_; }  // undefined without bias

 private:
  int64_t in_channels_, out_channels_, kernel_, stride_, padding_;
  Parameter weight_, bias_;
};

}  // namespace mixprec
