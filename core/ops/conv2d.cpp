// conv2d: NCHW input, OIHW weights, square stride and padding (groups = 1, dilation = 1).
// Forward and both backward passes are backend primitives (im2col + GEMM on the CPU, cuDNN
// on the GPU); this file checks shapes and records the graph.
#include "core/autograd/record.h"
#include "core/backend.h"
#include "core/math/window.h"
#include "core/ops/checks.h"
#include "core/ops/dims.h"
#include "core/ops/ops.h"

namespace mixprec::ops {
namespace {

struct Conv2dBackward final : Node {
  Tensor x, weight;
  Conv2dDesc desc;
  std::string name() const override { return "conv2d"; }

  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    Backend& backend = backend_for(g.device());
    Tensor gx, gw, gb;
    if (next_edges[0].valid()) {
      gx = Tensor::empty(x.shape(), x.dtype(), x.device());
      backend.conv2d_backward_data(g, weight, desc, gx);
    }
    const bool need_bias = next_edges.size() > 2 && next_edges[2].valid();
    if (next_edges[1].valid() || need_bias) {
      // The filter gradient comes with the bias gradient in one pass over dy; a filter
      // gradient that nothing needs is computed and dropped.
      gw = Tensor::empty(weight.shape(), weight.dtype(), weight.device());
      if (need_bias) gb = Tensor::empty({weight.size(0)}, weight.dtype(), weight.device());
      backend.conv2d_backward_filter(x, g, desc, gw, need_bias ? &gb : nullptr);
      if (!next_edges[1].valid()) gw = Tensor();
    }
    return {gx, gw, gb};
  }

  void release_saved() override {
    x = Tensor();
    weight = Tensor();
  }
};

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t stride,
              int64_t padding) {
  check_floating("conv2d", x);
  check_floating("conv2d", weight);
  if (bias.defined()) check_floating("conv2d", bias);
  check_same_dtype_device("conv2d", {&x, &weight, &bias});
  check_rank("conv2d", x, 4, "input [N, C, H, W]");
  check_rank("conv2d", weight, 4, "weight [O, C, KH, KW]");
  MIXPREC_CHECK(stride >= 1, "conv2d: stride must be >= 1, got ", stride);
  MIXPREC_CHECK(padding >= 0, "conv2d: padding must be >= 0, got ", padding);
  MIXPREC_CHECK(x.size(1) == weight.size(1), "conv2d: input ", describe(x), " has ", x.size(1),
                " channels but weight ", describe(weight), " expects ", weight.size(1));
  const int64_t out_channels = weight.size(0);
  MIXPREC_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == out_channels),
                "conv2d: bias ", describe(bias), " must be [", out_channels, "] to match weight ",
                describe(weight));
  check_window_fits("conv2d", x, weight.size(2), weight.size(3), padding, &weight);
  const int64_t oh = window_output_size(x.size(2), weight.size(2), stride, padding);
  const int64_t ow = window_output_size(x.size(3), weight.size(3), stride, padding);

  Conv2dDesc desc;
  desc.stride_h = desc.stride_w = stride;
  desc.pad_h = desc.pad_w = padding;
  Tensor y = Tensor::empty({x.size(0), out_channels, oh, ow}, x.dtype(), x.device());
  backend_for(x.device()).conv2d(x, weight, bias.defined() ? &bias : nullptr, desc, y);

  if (auto node = make_node<Conv2dBackward>({&x, &weight, &bias})) {
    node->x = save_for_backward(*node, x);
    node->weight = save_for_backward(*node, weight);
    node->desc = desc;
    attach_output(node, y);
  }
  check_forward("conv2d", y);
  return y;
}

}  // namespace mixprec::ops
