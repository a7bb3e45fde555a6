// Sequential: children named "0", "1", ... applied in order, as torch.nn.Sequential (and,
// since it only ever chains, also what stands for an nn.ModuleList of blocks that are applied
// in order, like GPT's transformer.h).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "layers/module.h"

namespace mixprec {

class Sequential : public Module {
 public:
  Sequential() = default;

  // Appends `layer` under the next index as its name; returns it.
  template <class M>
  std::shared_ptr<M> append(std::shared_ptr<M> layer) {
    register_module(std::to_string(layers_.size()), layer);
    layers_.push_back(layer);
    return layer;
  }

  // Each child in turn; the identity when empty.
  Tensor forward(const Tensor& x) override;
  // "Sequential(" and one indexed line per child, as torch prints it.
  std::string describe() const override;

  size_t size() const { return layers_.size(); }
  // The child at `index`; throws when out of range.
  const std::shared_ptr<Module>& at(size_t index) const;

 private:
  std::vector<std::shared_ptr<Module>> layers_;
};

}  // namespace mixprec
