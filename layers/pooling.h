// Square-window pooling over NCHW, as torch.nn.MaxPool2d / AvgPool2d (AvgPool2d counts the
// zero padding in the average: count_include_pad=True, torch's default).
#pragma once

#include <cstdint>
#include <string>

#include "layers/module.h"

namespace mixprec {

class MaxPool2d : public Module {
 public:
  // stride <= 0 means stride = kernel (torch's default). Throws for kernel < 1 or padding
  // outside [0, kernel / 2].
  explicit MaxPool2d(int64_t kernel, int64_t stride = 0, int64_t padding = 0);
  // x [N, C, H, W] -> [N, C, H', W'] with H' = (H + 2 padding - kernel) / stride + 1.
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  int64_t kernel() const { return kernel_; }
  int64_t stride() const { return stride_; }
  int64_t padding() const { return padding_; }

 private:
  int64_t kernel_, stride_, padding_;
};

class AvgPool2d : public Module {
 public:
  // As MaxPool2d.
  explicit AvgPool2d(int64_t kernel, int64_t stride = 0, int64_t padding = 0);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  int64_t kernel() const { return kernel_; }
  int64_t stride() const { return stride_; }
  int64_t padding() const { return padding_; }

 private:
  int64_t kernel_, stride_, padding_;
};

}  // namespace mixprec
