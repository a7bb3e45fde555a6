// Test helpers shared by the op tests.
//
// gradcheck: the analytic gradient of L = sum(f(inputs) * R), R a fixed random tensor, is
// compared with central finite differences (L(x+eps) - L(x-eps)) / 2eps. The forward runs in
// FP32 and L is accumulated in double, so the finite differences are the double-precision
// reference that the backward must match.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/autograd/grad_mode.h"
#include "core/generator.h"
#include "core/ops/ops.h"
#include "core/tensor.h"

namespace mixprec::testing {

inline Tensor random_tensor(const Shape& shape, uint64_t seed, float low = -1.f, float high = 1.f,
                            DType dtype = DType::F32) {
  Generator gen(seed);
  return Tensor::uniform(shape, gen, low, high, dtype);
}

// The bits of each element of a CPU tensor, zero-extended to 32 bits.
inline std::vector<uint32_t> bits_of(const Tensor& t) {
  const size_t esize = dtype_size(t.dtype());
  std::vector<uint32_t> bits(static_cast<size_t>(t.numel()), 0);
  const auto* p = static_cast<const unsigned char*>(t.data());
  for (size_t i = 0; i < bits.size(); ++i) std::memcpy(&bits[i], p + i * esize, esize);
  return bits;
}

// |got - expected| in units of `allowed`. Non-finite values must match exactly (the same
// infinity, or NaN for NaN); otherwise the error is infinite, so a NaN never slips through a
// comparison that is false for NaN.
inline double scaled_error(double got, double expected, double allowed) {
  if (!std::isfinite(got) || !std::isfinite(expected)) {
    const bool same = (std::isnan(got) && std::isnan(expected)) || got == expected;
    return same ? 0.0 : std::numeric_limits<double>::infinity();
  }
  return std::abs(got - expected) / allowed;
}

struct GradcheckOptions {
  double eps = 3e-3;
  double atol = 2e-3;
  double rtol = 2e-2;
  uint64_t seed = 12345;
};

using TensorFn = std::function<Tensor(const std::vector<Tensor>&)>;

inline double weighted_sum(const Tensor& out, const std::vector<float>& weights) {
  const std::vector<float> values = out.to_float_vector();
  double total = 0;
  for (size_t i = 0; i < values.size(); ++i) total += static_cast<double>(values[i]) * weights[i];
  return total;
}

// Checks d sum(f(x) * R) / dx for every floating input that requires grad (set it before
// calling; `inputs` are F32 leaves). Fails the current test with the worst element.
inline void gradcheck(const std::string& label, const TensorFn& f, std::vector<Tensor> inputs,
                      GradcheckOptions options = {}) {
  for (Tensor& t : inputs) t.reset_grad();
  Tensor out = f(inputs);
  REQUIRE(out.defined());
  const Tensor weights_t = random_tensor(out.shape(), options.seed, -1.f, 1.f);
  const std::vector<float> weights = weights_t.to_float_vector();
  out.backward(weights_t.to(out.dtype()));

  for (size_t which = 0; which < inputs.size(); ++which) {
    Tensor& x = inputs[which];
    if (!x.requires_grad()) continue;
    const Tensor analytic = x.grad();
    REQUIRE(analytic.defined());
    const std::vector<float> a = analytic.to_float_vector();
    double worst = 0;
    std::string worst_text;
    for (int64_t j = 0; j < x.numel(); ++j) {
      const double original = x.get(j);
      x.set(j, original + options.eps);
      double plus, minus;
      {
        NoGradGuard no_grad;
        plus = weighted_sum(f(inputs), weights);
        x.set(j, original - options.eps);
        minus = weighted_sum(f(inputs), weights);
      }
      x.set(j, original);
      const double numeric = (plus - minus) / (2 * options.eps);
      const double allowed = options.atol + options.rtol * std::max(std::abs(numeric), std::abs((double)a[j]));
      const double err = scaled_error(a[j], numeric, allowed);
      if (err > worst) {
        worst = err;
        std::ostringstream msg;
        msg << label << ": input " << which << " element " << j << ": analytic " << a[j]
            << " vs numeric " << numeric;
        worst_text = msg.str();
      }
    }
    INFO(worst_text);
    CHECK(worst <= 1.0);
  }
}

// Max |a - b| / (atol + rtol |b|) over all elements must be <= 1.
inline void require_close(const Tensor& a, const Tensor& b, double rtol, double atol,
                          const std::string& label = "") {
  REQUIRE(a.shape() == b.shape());
  const std::vector<float> va = a.to_float_vector(), vb = b.to_float_vector();
  double worst = 0;
  int64_t at = -1;
  for (size_t i = 0; i < va.size(); ++i) {
    const double r = scaled_error(va[i], vb[i], atol + rtol * std::abs((double)vb[i]));
    if (r > worst) {
      worst = r;
      at = static_cast<int64_t>(i);
    }
  }
  INFO(label << ": worst at " << at << ": " << (at >= 0 ? va[at] : 0.f) << " vs "
             << (at >= 0 ? vb[at] : 0.f));
  CHECK(worst <= 1.0);
}

// Checks y against a reference computed in double: the worst relative error
// |y - expected| / (1 + |expected|) must be below tol.
inline void require_matches(const Tensor& y, const std::vector<double>& expected, double tol,
                            const std::string& label = "") {
  const std::vector<float> got = y.to_float_vector();
  REQUIRE(got.size() == expected.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, scaled_error(got[i], expected[i], 1.0 + std::abs(expected[i])));
  INFO(label << ": worst relative error " << worst << ", tolerance " << tol);
  CHECK(worst < tol);
}

// Row-major coordinates of element `flat` of `shape`.
inline std::vector<int64_t> coords_of(int64_t flat, const Shape& shape) {
  std::vector<int64_t> c(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    c[d] = flat % shape[d];
    flat /= shape[d];
  }
  return c;
}

// Tolerances for comparing an F16/BF16 forward against the F32 one: inputs and output each
// rounded once, so a few units in the last place of the format.
inline double low_precision_rtol(DType dtype) {
  return dtype == DType::F16 ? 5e-3 : dtype == DType::BF16 ? 3e-2 : 1e-5;
}

// Runs f on the F32 inputs and on the same inputs cast to `dtype`, and compares.
inline void check_low_precision(const std::string& label, const TensorFn& f,
                                const std::vector<Tensor>& inputs, DType dtype,
                                double atol_scale = 1.0) {
  NoGradGuard no_grad;
  const Tensor reference = f(inputs);
  std::vector<Tensor> low;
  for (const Tensor& t : inputs) low.push_back(is_floating(t.dtype()) ? t.detach().to(dtype) : t);
  const Tensor result = f(low);
  const double rtol = low_precision_rtol(dtype);
  require_close(result, reference, rtol, rtol * atol_scale, label + " " + std::string(dtype_name(dtype)));
}

// Input gradients of one backward in a 16-bit dtype and of the same backward in F32.
struct LowPrecisionGrads {
  std::vector<Tensor> low;        // each in `dtype`
  std::vector<Tensor> reference;  // each F32
};

// Backpropagates `grad` through f twice: on the (F32) inputs cast to `dtype`, with grad cast
// to `dtype`, and on the F32 inputs themselves, with grad cast to F32 (so a grad given in
// `dtype` feeds both runs the same values). Requires f's output and every input gradient of
// the first run to have `dtype`; the caller compares the two sets with its own tolerances.
inline LowPrecisionGrads low_precision_grads(const TensorFn& f, const std::vector<Tensor>& inputs,
                                             const Tensor& grad, DType dtype) {
  std::vector<Tensor> low, full;
  for (const Tensor& t : inputs) {
    low.push_back(t.detach().to(dtype).set_requires_grad(true));
    full.push_back(t.detach().clone().set_requires_grad(true));
  }
  const Tensor y = f(low);
  REQUIRE(y.dtype() == dtype);
  y.backward(grad.to(dtype));
  f(full).backward(grad.to(DType::F32));
  LowPrecisionGrads grads;
  for (size_t i = 0; i < inputs.size(); ++i) {
    REQUIRE(low[i].grad().defined());
    REQUIRE(low[i].grad().dtype() == dtype);
    grads.low.push_back(low[i].grad());
    grads.reference.push_back(full[i].grad());
  }
  return grads;
}

// low_precision_grads, then every low-precision gradient i within rtol and atols[i] of the
// F32 one (require_close).
inline void check_low_precision_grads(const std::string& label, const TensorFn& f,
                                      const std::vector<Tensor>& inputs, const Tensor& grad,
                                      DType dtype, double rtol, const std::vector<double>& atols) {
  REQUIRE(atols.size() == inputs.size());
  const LowPrecisionGrads grads = low_precision_grads(f, inputs, grad, dtype);
  for (size_t i = 0; i < inputs.size(); ++i)
    require_close(grads.low[i], grads.reference[i], rtol, atols[i],
                  label + " grad " + std::to_string(i) + " " + std::string(dtype_name(dtype)));
}

}  // namespace mixprec::testing
