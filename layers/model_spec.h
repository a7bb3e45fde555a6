// What a model builder needs to know, as plain values: the config loader (apps/config) fills
// these from YAML, tests fill them by hand. Validation happens in the builders, which throw
// mixprec::Error naming the layer index or the field.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mixprec {

// One item of a `type: cnn` layer list.
struct CnnLayerSpec {
  enum class Kind { Conv, BatchNorm, ReLU, GELU, MaxPool, AvgPool, Flatten, Linear, Dropout };
  Kind kind = Kind::ReLU;
  int64_t out = 0;       // conv: out channels; linear: out features
  int64_t kernel = 3;    // conv kernel; pool kernel (the value of `maxpool: k`)
  int64_t stride = 1;    // conv stride; pools: stride (default = kernel, set by the loader)
  int64_t padding = 0;   // conv and pools
  bool bias = true;      // conv and linear
  double p = 0.0;        // dropout probability
};

struct CnnSpec {
  int64_t in_channels = 1;
  int64_t input_size = 28;  // square H = W
  std::vector<CnnLayerSpec> layers;
  // A batchnorm directly followed by a relu runs as one fused op (BatchNorm2d::fuse_relu):
  // the same numbers, forward and backward, in fewer passes over memory. Not a config key;
  // mixprec inspect turns it off so that every layer's own output gradient can be observed.
  bool fuse_batchnorm_relu = true;
};

// nanoGPT's GPTConfig.
struct GptSpec {
  int64_t vocab_size = 0;   // 0 = take it from the data (the trainer fills it in)
  int64_t block_size = 128;
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  double dropout = 0.0;
  bool bias = true;
  bool tie_weights = false;
  // Each MLP's c_fc and the gelu after it run as one GEMM with a (bias+)GELU epilogue
  // (Linear::fuse_gelu): one rounding fewer in 16-bit dtypes; in FP32 the same bits on the
  // CPU. Not a config key; mixprec inspect turns it off so that c_fc's own output can be
  // observed.
  bool fuse_linear_gelu = true;
};

const char* cnn_layer_kind_name(CnnLayerSpec::Kind kind);  // "conv", "batchnorm", ...

}  // namespace mixprec
