#include "layers/pooling.h"

#include "core/error.h"
#include "core/ops/ops.h"

namespace mixprec {
namespace {

void check_pool(const char* layer, int64_t kernel, int64_t stride, int64_t padding) {
  MIXPREC_CHECK(kernel >= 1, layer, ": kernel must be >= 1, got ", kernel);
  MIXPREC_CHECK(stride >= 1, layer, ": stride must be >= 1, got ", stride);
  MIXPREC_CHECK(padding >= 0 && padding <= kernel / 2, layer,
                ": padding must be in [0, kernel / 2 = ", kernel / 2, "], got ", padding);
}

}  // namespace

MaxPool2d::MaxPool2d(int64_t kernel, int64_t stride, int64_t padding)
    : kernel_(kernel), stride_(stride <= 0 ? kernel : stride), padding_(padding) {
  check_pool("MaxPool2d", kernel_, stride_, padding_);
}

Tensor MaxPool2d::forward(const Tensor& x) {
  return ops::max_pool2d(x, kernel_, stride_, padding_);
}

std::string MaxPool2d::describe() const {
  return detail::concat("MaxPool2d(kernel_size=", kernel_, ", stride=", stride_,
                        ", padding=", padding_, ")");
}

AvgPool2d::AvgPool2d(int64_t kernel, int64_t stride, int64_t padding)
    : kernel_(kernel), stride_(stride <= 0 ? kernel : stride), padding_(padding) {
  check_pool("AvgPool2d", kernel_, stride_, padding_);
}

Tensor AvgPool2d::forward(const Tensor& x) {
  return ops::avg_pool2d(x, kernel_, stride_, padding_);
}

std::string AvgPool2d::describe() const {
  return detail::concat("AvgPool2d(kernel_size=", kernel_, ", stride=", stride_,
                        ", padding=", padding_, ")");
}

}  // namespace mixprec
