// max_pool2d and avg_pool2d over NCHW with a square window. Max pooling keeps the argmax
// (I32, flat index within each input plane) for its backward; average pooling divides by
// the full window, padding included (PyTorch's count_include_pad=True).
#include "core/autograd/record.h"
#include "core/backend.h"
#include "core/math/window.h"
#include "core/ops/checks.h"
#include "core/ops/dims.h"
#include "core/ops/ops.h"

namespace mixprec::ops {
namespace {

struct Pool2dBackward final : Node {
  Pool2dDesc desc;
  Shape input_shape;
  DType input_dtype = DType::F32;
  Tensor argmax;  // max pooling only
  std::string name() const override {
    return desc.kind == PoolKind::Max ? "max_pool2d" : "avg_pool2d";
  }

  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    Tensor gx = Tensor::empty(input_shape, input_dtype, g.device());
    backend_for(g.device()).pool2d_backward(desc, g, argmax.defined() ? &argmax : nullptr, gx);
    return {gx};
  }

  void release_saved() override { argmax = Tensor(); }
};

Tensor pool2d(const char* op, PoolKind kind, const Tensor& x, int64_t kernel, int64_t stride,
              int64_t padding) {
  check_floating(op, x);
  check_rank(op, x, 4, "input [N, C, H, W]");
  if (stride == -1) stride = kernel;
  MIXPREC_CHECK(kernel >= 1, op, ": kernel must be >= 1, got ", kernel);
  MIXPREC_CHECK(stride >= 1, op, ": stride must be >= 1 (or -1 for the kernel size), got ", stride);
  MIXPREC_CHECK(padding >= 0 && padding <= kernel / 2, op,
                ": padding must be in [0, kernel / 2 = ", kernel / 2, "], got ", padding,
                " for kernel ", kernel);
  check_window_fits(op, x, kernel, kernel, padding);

  Pool2dDesc desc;
  desc.kind = kind;
  desc.kernel_h = desc.kernel_w = kernel;
  desc.stride_h = desc.stride_w = stride;
  desc.pad_h = desc.pad_w = padding;
  const Shape out_shape{x.size(0), x.size(1), window_output_size(x.size(2), kernel, stride, padding),
                        window_output_size(x.size(3), kernel, stride, padding)};
  Tensor y = Tensor::empty(out_shape, x.dtype(), x.device());
  Tensor argmax;
  const bool record = any_requires_grad({&x});
  if (kind == PoolKind::Max && record) argmax = Tensor::empty(out_shape, DType::I32, x.device());
  backend_for(x.device()).pool2d(desc, x, y, argmax.defined() ? &argmax : nullptr);

  if (auto node = make_node<Pool2dBackward>({&x})) {
    node->desc = desc;
    node->input_shape = x.shape();
    node->input_dtype = x.dtype();
    node->argmax = argmax;
    attach_output(node, y);
  }
  check_forward(op, y);
  return y;
}

}  // namespace

Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding) {
  return pool2d("max_pool2d", PoolKind::Max, x, kernel, stride, padding);
}

Tensor avg_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding) {
  return pool2d("avg_pool2d", PoolKind::Avg, x, kernel, stride, padding);
}

}  // namespace mixprec::ops
