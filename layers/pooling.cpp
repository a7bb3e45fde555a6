#include "layers/pooling.h"

#include "core/error.h"
#include "core/ops/ops.h"

namespace mixprec {

Pool2d::Pool2d(const char* layer, int64_t kernel, int64_t stride, int64_t padding)
    : layer_(layer), kernel_(kernel), stride_(stride <= 0 ? kernel : stride), padding_(padding) {
  MIXPREC_CHECK(kernel_ >= 1, layer_, ": kernel must be >= 1, got ", kernel_);
  MIXPREC_CHECK(stride_ >= 1, layer_, ": stride must be >= 1, got ", stride_);
  MIXPREC_CHECK(padding_ >= 0 && padding_ <= kernel_ / 2, layer_,
                ": padding must be in [0, kernel / 2 = ", kernel_ / 2, "], got ", padding_);
}

std::string Pool2d::describe() const {
  return detail::concat(layer_, "(kernel_size=", kernel_, ", stride=", stride_,
                        ", padding=", padding_, ")");
}

Tensor MaxPool2d::forward(const Tensor& x) {
  return ops::max_pool2d(x, kernel(), stride(), padding());
}

Tensor AvgPool2d::forward(const Tensor& x) {
  return ops::avg_pool2d(x, kernel(), stride(), padding());
}

}  // namespace mixprec
