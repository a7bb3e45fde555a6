// Square-window pooling over NCHW, as torch.nn.MaxPool2d / AvgPool2d (AvgPool2d counts the
// zero padding in the average: count_include_pad=True, torch's default).
#pragma once

#include <cstdint>
#include <string>

#include "layers/module.h"

namespace mixprec {

// What both pools share: the window settings, their checks and the description.
class Pool2d : public Module {
 public:
  std::string describe() const override;
  int64_t kernel() const { return kernel_; }
  int64_t stride() const { return stride_; }
  int64_t padding() const { return padding_; }

 protected:
  // stride <= 0 means stride = kernel (torch's default). Throws, naming `layer`, for
  // kernel < 1 or padding outside [0, kernel / 2].
  Pool2d(const char* layer, int64_t kernel, int64_t stride, int64_t padding);

 private:
  const char* layer_;
  int64_t kernel_, stride_, padding_;
};

class MaxPool2d : public Pool2d {
 public:
  explicit MaxPool2d(int64_t kernel, int64_t stride = 0, int64_t padding = 0)
      : Pool2d("MaxPool2d", kernel, stride, padding) {}
  // x [N, C, H, W] -> [N, C, H', W'] with H' = (H + 2 padding - kernel) / stride + 1.
  Tensor forward(const Tensor& x) override;
};

class AvgPool2d : public Pool2d {
 public:
  explicit AvgPool2d(int64_t kernel, int64_t stride = 0, int64_t padding = 0)
      : Pool2d("AvgPool2d", kernel, stride, padding) {}
  // As MaxPool2d, averaging each window.
  Tensor forward(const Tensor& x) override;
};

}  // namespace mixprec
