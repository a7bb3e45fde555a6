// The names of the CNN layer kinds, as the config's layer lists spell them.
#include "layers/model_spec.h"

namespace mixprec {

const char* cnn_layer_kind_name(CnnLayerSpec::Kind kind) {
  switch (kind) {
    case CnnLayerSpec::Kind::Conv: return "conv";
    case CnnLayerSpec::Kind::BatchNorm: return "batchnorm";
    case CnnLayerSpec::Kind::ReLU: return "relu";
    case CnnLayerSpec::Kind::GELU: return "gelu";
    case CnnLayerSpec::Kind::MaxPool: return "maxpool";
    case CnnLayerSpec::Kind::AvgPool: return "avgpool";
    case CnnLayerSpec::Kind::Flatten: return "flatten";
    case CnnLayerSpec::Kind::Linear: return "linear";
    case CnnLayerSpec::Kind::Dropout: return "dropout";
  }
  return "unknown";
}

}  // namespace mixprec
