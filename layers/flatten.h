// Flatten: merges dims start_dim..end_dim, as torch.nn.Flatten (default: all but the batch
// dim, [N, C, H, W] -> [N, C*H*W]).
#pragma once

#include <cstdint>
#include <string>

#include "layers/module.h"

namespace mixprec {

class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1)
      : start_dim_(start_dim), end_dim_(end_dim) {}
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;

 private:
  int64_t start_dim_, end_dim_;
};

}  // namespace mixprec
