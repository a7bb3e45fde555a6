#include "apps/config/layer_kinds.h"

#include "core/error.h"

namespace mixprec::config_loader {
namespace {

const std::vector<LayerKindName>& layer_kinds() {
  using Kind = CnnLayerSpec::Kind;
  static const std::vector<LayerKindName> kinds = {
      {Kind::Conv, "conv", true, "{conv: 32, kernel: 3, padding: 1}"},
      {Kind::BatchNorm, "batchnorm", false, "batchnorm"},
      {Kind::ReLU, "relu", false, "relu"},
      {Kind::GELU, "gelu", false, "gelu"},
      {Kind::MaxPool, "maxpool", true, "{maxpool: 2}"},
      {Kind::AvgPool, "avgpool", true, "{avgpool: 2}"},
      {Kind::Flatten, "flatten", false, "flatten"},
      {Kind::Linear, "linear", true, "{linear: 128}"},
      {Kind::Dropout, "dropout", true, "{dropout: 0.1}"},
  };
  return kinds;
}

}  // namespace

const LayerKindName* find_layer_kind(const std::string& name) {
  for (const LayerKindName& kind : layer_kinds())
    if (name == kind.name) return &kind;
  return nullptr;
}

const LayerKindName& layer_kind_entry(CnnLayerSpec::Kind kind) {
  for (const LayerKindName& entry : layer_kinds())
    if (entry.kind == kind) return entry;
  MIXPREC_FAIL("to_yaml: unknown CNN layer kind ", static_cast<int>(kind));
}

std::vector<std::string> layer_kind_names() {
  std::vector<std::string> names;
  for (const LayerKindName& kind : layer_kinds()) names.push_back(kind.name);
  return names;
}

}  // namespace mixprec::config_loader
