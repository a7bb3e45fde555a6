#include "layers/sequential.h"

#include <sstream>

#include "core/error.h"

namespace mixprec {

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (const auto& layer : layers_) y = (*layer)(y);
  return y;
}

std::string Sequential::describe() const {
  std::ostringstream out;
  out << "Sequential(";
  for (size_t i = 0; i < layers_.size(); ++i) {
    // A nested container's lines are indented one level further.
    std::string child = layers_[i]->describe();
    for (size_t pos = child.find('\n'); pos != std::string::npos; pos = child.find('\n', pos + 1))
      child.insert(pos + 1, "  ");
    out << "\n  (" << i << "): " << child;
  }
  out << (layers_.empty() ? ")" : "\n)");
  return out.str();
}

const std::shared_ptr<Module>& Sequential::at(size_t index) const {
  MIXPREC_CHECK(index < layers_.size(), "Sequential::at: index ", index, " is out of range for ",
                layers_.size(), " layers");
  return layers_[index];
}

}  // namespace mixprec
