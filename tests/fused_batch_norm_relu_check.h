// The check that batch norm with its relu fused (ops::batch_norm2d(..., relu = true)) gives
// the bits of relu(batch_norm2d(...)) forward and backward, on any device: the output, the
// running statistics, and the gradients of x, weight and bias, for F32, F16 and BF16, in
// training and eval mode. A second, hand-built eval case puts batch-norm outputs exactly where
// the two could part: values that round to zero only when stored in F16, zeros, negative
// zeros and a NaN.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/generator.h"
#include "core/ops/ops.h"
#include "core/tensor.h"
#include "tests/tensor_bytes.h"

namespace mixprec::testing {

using mixprec_test::float_bits;

struct BatchNormReluRun {
  Tensor y, dx, dweight, dbias, running_mean, running_var;
};

// One forward and backward on `device`, fused or as batch_norm2d then relu. Inputs are host
// F32 tensors, converted to `dtype` on the device; the running statistics start as given.
inline BatchNormReluRun run_batch_norm_relu(bool fused, const Tensor& x, const Tensor& weight,
                                            const Tensor& bias, const Tensor& running_mean,
                                            const Tensor& running_var, const Tensor& dy,
                                            bool training, double eps, DType dtype,
                                            Device device) {
  Tensor xd = x.to(dtype).to(device).detach().set_requires_grad(true);
  Tensor wd = weight.to(dtype).to(device).detach().set_requires_grad(true);
  Tensor bd = bias.to(dtype).to(device).detach().set_requires_grad(true);
  Tensor rm = running_mean.to(device), rv = running_var.to(device);
  const Tensor y = fused ? ops::batch_norm2d(xd, wd, bd, rm, rv, training, 0.1, eps, true)
                         : ops::relu(ops::batch_norm2d(xd, wd, bd, rm, rv, training, 0.1, eps));
  y.backward(dy.to(dtype).to(device));
  return {y.to(kCPU), xd.grad().to(kCPU), wd.grad().to(kCPU), bd.grad().to(kCPU), rm.to(kCPU),
          rv.to(kCPU)};
}

inline void expect_same_runs(const BatchNormReluRun& fused, const BatchNormReluRun& plain) {
  CHECK(fused.y.dtype() == plain.y.dtype());
  CHECK(float_bits(fused.y) == float_bits(plain.y));
  CHECK(float_bits(fused.dx) == float_bits(plain.dx));
  CHECK(float_bits(fused.dweight) == float_bits(plain.dweight));
  CHECK(float_bits(fused.dbias) == float_bits(plain.dbias));
  CHECK(float_bits(fused.running_mean) == float_bits(plain.running_mean));
  CHECK(float_bits(fused.running_var) == float_bits(plain.running_var));
}

inline void check_fused_batch_norm_relu(Device device) {
  const Shape shape{3, 4, 5, 7};
  const int64_t n = 3 * 4 * 5 * 7;
  Generator gen(1);
  const Tensor x = Tensor::uniform(shape, gen, -2.f, 2.f);
  const Tensor dy = Tensor::uniform(shape, gen, -1.f, 1.f);
  const Tensor w = Tensor::from_vector({0.5f, 1.25f, -0.75f, 1.0f}, {4}, DType::F32);
  // Biases that move a good share of each channel across zero.
  const Tensor b = Tensor::from_vector({0.3f, -0.6f, 0.1f, 0.0f}, {4}, DType::F32);
  const Tensor rm = Tensor::from_vector({0.1f, -0.2f, 0.0f, 0.5f}, {4}, DType::F32);
  const Tensor rv = Tensor::from_vector({1.5f, 0.5f, 1.0f, 2.0f}, {4}, DType::F32);
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    for (bool training : {true, false}) {
      INFO(dtype_name(dtype) << (training ? " training" : " eval"));
      const BatchNormReluRun fused =
          run_batch_norm_relu(true, x, w, b, rm, rv, dy, training, 1e-5, dtype, device);
      const BatchNormReluRun plain =
          run_batch_norm_relu(false, x, w, b, rm, rv, dy, training, 1e-5, dtype, device);
      expect_same_runs(fused, plain);
      // The relu did act: some outputs are zero and their gradient did not pass.
      const std::vector<float> y = fused.y.to_float_vector();
      CHECK(std::count(y.begin(), y.end(), 0.0f) > n / 5);
    }
  }

  // Eval with mean 0, variance 1 and eps 0, so that y = x * weight + bias exactly: weight
  // 2^-20 takes x = 2^-6 to 2^-26, which F16 stores as 0 (so relu's gradient is 0 there) while
  // F32 and BF16 keep it positive; then exact zeros, signed zeros, a NaN (kept by relu with
  // its gradient) and ordinary values; last, the outputs at each 16-bit format's last value
  // that rounds to zero (a tie, to the even zero) and half as much again above it: 2^-25 and
  // 1.5 * 2^-25 for F16, 2^-134 and 1.5 * 2^-134 for BF16 (x = 2^-114, which F16 stores as 0).
  const std::vector<float> special = {0.015625f,  -0.015625f, 0.0f,      -0.0f,
                                      NAN,        3.0f,       -3.0f,     0.5f,
                                      0x1p-5f,    0x1.8p-5f,  0x1p-114f, 0x1.8p-114f};
  const Shape small{2, 1, 2, 3};
  const Tensor xs = Tensor::from_vector(special, small, DType::F32);
  const Tensor dys =
      Tensor::from_vector({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, small, DType::F32);
  const Tensor ws = Tensor::from_vector({0x1p-20f}, {1}, DType::F32);
  const Tensor bs = Tensor::from_vector({0.0f}, {1}, DType::F32);
  const Tensor zero = Tensor::from_vector({0.0f}, {1}, DType::F32);
  const Tensor one = Tensor::from_vector({1.0f}, {1}, DType::F32);
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    INFO(dtype_name(dtype) << " hand-built eval case");
    const BatchNormReluRun fused =
        run_batch_norm_relu(true, xs, ws, bs, zero, one, dys, false, 0.0, dtype, device);
    const BatchNormReluRun plain =
        run_batch_norm_relu(false, xs, ws, bs, zero, one, dys, false, 0.0, dtype, device);
    expect_same_runs(fused, plain);
    const std::vector<float> dx = fused.dx.to_float_vector();
    // x = 2^-6: the gradient passes unless F16 stored the output as zero.
    CHECK((dx[0] == 0.0f) == (dtype == DType::F16));
    CHECK(dx[1] == 0.0f);
    CHECK(std::isnan(fused.y.to_float_vector()[4]));
    CHECK(dx[5] != 0.0f);
    // At each format's threshold: the tie stores 0, just above it a positive value.
    CHECK((dx[8] == 0.0f) == (dtype == DType::F16));
    CHECK(dx[9] != 0.0f);
    CHECK((dx[10] == 0.0f) == (dtype != DType::F32));
    CHECK((dx[11] == 0.0f) == (dtype == DType::F16));
  }
}

}  // namespace mixprec::testing
