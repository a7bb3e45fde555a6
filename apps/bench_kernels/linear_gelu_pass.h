// An MLP's first layer and its gelu, forward then backward through autograd, for the
// benchmarks of both backends: fused, one ops::linear_gelu (the GEMM's GELU epilogue keeps
// the pre-GELU sums; gelu's backward feeds the linear's); composed, ops::gelu(ops::linear).
// On the CPU, in FP32, both give the same bits (tests/core/test_linear_gelu.cpp).
#pragma once

#include "core/ops/ops.h"
#include "core/tensor.h"

namespace mixprec::bench {

// x [rows, in] and w [out, in] are leaves whose gradients each pass recomputes from
// scratch; grad [rows, out] is the gradient fed to the gelu's output. No bias (the GPT
// configs have none).
struct LinearGeluPass {
  Tensor x, w, grad;

  LinearGeluPass(const Tensor& x_in, const Tensor& w_in, const Tensor& grad_in)
      : x(x_in), w(w_in), grad(grad_in) {
    x.set_requires_grad(true);
    w.set_requires_grad(true);
  }

  void run(bool fused) {
    x.reset_grad();
    w.reset_grad();
    const Tensor y = fused ? ops::linear_gelu(x, w) : ops::gelu(ops::linear(x, w));
    y.backward(grad);
  }
};

}  // namespace mixprec::bench
