// Backend agreement tests of the CUDA backend against the CPU backend (the reference), in
// the style of ggml's test-backend-ops: inputs are drawn on the CPU and copied to the GPU,
// every GPU output is poisoned before the primitive runs (so an element it fails to write
// fails the comparison), and the two results are compared bit for bit where both backends
// do the same single rounding, or within a per-dtype tolerance where the FP32 arithmetic
// may differ (libm vs CUDA math, fused multiply-adds, summation order).
//
// Every test starts with MIXPREC_REQUIRE_CUDA(), which registers the backend on first use
// and, on a machine without a device, prints why the test was skipped and returns (a pass).
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/half.h"
#include "core/tensor.h"
#include "cuda/device_query.h"
#include "cuda/register.h"

namespace mixprec::cuda_test {

// True when a device is present and the CUDA backend is registered.
inline bool cuda_ready() {
  static const bool ready = cuda_device_count() > 0 && register_cuda_backend();
  return ready;
}

#define MIXPREC_REQUIRE_CUDA()                                                     \
  do {                                                                             \
    if (!::mixprec::cuda_test::cuda_ready()) {                                     \
      WARN("skipped: " << ::mixprec::cuda_status_line());                          \
      return;                                                                      \
    }                                                                              \
  } while (0)

inline Device gpu() { return cuda_device(0); }
inline Backend& cpu_backend() { return backend_for(kCPU); }
inline Backend& gpu_backend() { return backend_for(gpu()); }

inline constexpr DType kFloatingTypes[] = {DType::F32, DType::F16, DType::BF16};
// One element, a short tail only, a vector body with a tail, and more than one block.
inline constexpr int64_t kOddSizes[] = {1, 7, 1023, 4097};

// Uniform values in [low, high) rounded once to `dtype`, as a CPU tensor.
inline Tensor random_tensor(const Shape& shape, DType dtype, std::mt19937& rng, float low = -2.0f,
                            float high = 2.0f) {
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> values(static_cast<size_t>(shape_numel(shape)));
  for (float& v : values) v = dist(rng);
  return Tensor::from_vector(values, shape, dtype);
}

// The poison of one element: for the floating dtypes a signaling NaN with a payload of its
// own (F32 0x7FA5A5A5, F16 0x7D5A, BF16 0x7FA5), the largest int for I32. Not the GPU's
// canonical NaN (0x7FFFFFFF, and 0x7FFF once narrowed), which kernels compute from NaN
// inputs, so an unwritten element never looks like a computed NaN; arithmetic never yields a
// signaling NaN, and no input of the tests holds these bits, so no primitive under test
// produces them. expect_close and expect_bits_equal accept them only where the expected
// tensor holds them too (an element both backends were to leave untouched).
inline uint32_t poison_bits(DType dtype) {
  switch (dtype) {
    case DType::F32: return 0x7FA5A5A5u;
    case DType::F16: return 0x7D5Au;
    case DType::BF16: return 0x7FA5u;
    case DType::I32: return 0x7FFFFFFFu;
  }
  return 0x7FFFFFFFu;
}

// Overwrites every element of a tensor (on any device) with the poison.
inline void poison(Tensor& t) {
  const size_t esize = dtype_size(t.dtype());
  const uint32_t bits = poison_bits(t.dtype());
  std::vector<unsigned char> bytes(t.nbytes());
  for (size_t i = 0; i < bytes.size(); i += esize) std::memcpy(bytes.data() + i, &bits, esize);
  if (!bytes.empty()) backend_for(t.device()).copy_from_host(t.data(), bytes.data(), bytes.size());
}

// A copy of `t` on the GPU.
inline Tensor on_gpu(const Tensor& t) { return t.to(gpu()); }

// Copies of `ts` on `device` (clones on the CPU, so a step on them leaves `ts` alone); an
// undefined tensor stays undefined.
inline std::vector<Tensor> copies_on(const std::vector<Tensor>& ts, Device device) {
  std::vector<Tensor> out;
  for (const Tensor& t : ts) {
    if (!t.defined()) out.push_back(Tensor());
    else out.push_back(device.is_cpu() ? t.clone() : t.to(device));
  }
  return out;
}

// The one-element I32 tensor on `device` that tells a deferred step which entry of its rate
// table to take.
inline Tensor taken_on(int32_t j, Device device) { return Tensor::from_ints({j}, {1}, device); }

// A new tensor on `device` (the GPU unless given) whose every element is poisoned.
inline Tensor poisoned(const Shape& shape, DType dtype, Device device = gpu()) {
  Tensor t = Tensor::empty(shape, dtype, device);
  poison(t);
  return t;
}

// `count` ids drawn uniformly from [0, upper).
inline std::vector<int32_t> random_ids(int64_t count, int64_t upper, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(upper - 1));
  std::vector<int32_t> ids(static_cast<size_t>(count));
  for (int32_t& id : ids) id = dist(rng);
  return ids;
}

// The raw element bits of a tensor (on any device), zero-extended to 32 bits.
inline std::vector<uint32_t> element_bits(const Tensor& t) {
  const Tensor host = t.to(kCPU);
  const size_t esize = dtype_size(host.dtype());
  std::vector<uint32_t> bits(static_cast<size_t>(host.numel()), 0);
  const auto* p = static_cast<const unsigned char*>(host.data());
  for (size_t i = 0; i < bits.size(); ++i) std::memcpy(&bits[i], p + i * esize, esize);
  return bits;
}

inline std::string hex(uint32_t bits) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08X", bits);
  return text;
}

// Bit-for-bit equality of two tensors (on any devices) of one dtype and shape.
inline void expect_bits_equal(const Tensor& expected, const Tensor& actual) {
  REQUIRE(expected.dtype() == actual.dtype());
  REQUIRE(expected.shape() == actual.shape());
  const std::vector<uint32_t> e = element_bits(expected), a = element_bits(actual);
  std::ostringstream report;
  int64_t mismatches = 0;
  for (size_t i = 0; i < e.size(); ++i) {
    if (e[i] == a[i]) continue;
    if (++mismatches <= 5) report << "element " << i << ": expected " << hex(e[i]) << ", got " << hex(a[i]) << "\n";
  }
  INFO(describe(actual) << ", " << mismatches << " of " << e.size() << " elements differ\n"
                        << report.str());
  CHECK(mismatches == 0);
}

// Runs `primitive(backend, device, out)` on the CPU (out empty) and on the GPU (out
// poisoned), out of `shape` and `dtype`, and compares the two outputs bit for bit: for
// primitives of one rounding, whose inputs the call moves to `device` itself.
template <class Primitive>
void expect_backends_agree_bitwise(const Shape& shape, DType dtype, const Primitive& primitive) {
  Tensor expected = Tensor::empty(shape, dtype);
  primitive(cpu_backend(), kCPU, expected);
  Tensor actual = poisoned(shape, dtype);
  primitive(gpu_backend(), gpu(), actual);
  expect_bits_equal(expected, actual);
}

// The lines of `text`, without their line ends.
inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

struct Tolerance {
  double rtol = 0.0;
  double atol = 0.0;
};

// FP32 1e-5, FP16 1e-3, BF16 1e-2 relative; the same absolute floor, for results near zero
// of O(1) computations.
inline Tolerance tolerance_for(DType dtype) {
  switch (dtype) {
    case DType::F32: return {1e-5, 1e-5};
    case DType::F16: return {1e-3, 1e-3};
    case DType::BF16: return {1e-2, 1e-2};
    case DType::I32: return {0.0, 0.0};
  }
  return {};
}

// |actual - expected| <= atol + rtol * (|expected| + magnitude[i]) element by element, where
// `magnitude` (optional) is the size of what was summed into element i, for reductions.
// Infinities must match exactly; an expected NaN needs a NaN. The poison's bits pass only
// where the expected element has them too, so an element left unwritten fails even where
// the result is NaN.
inline void expect_close(const Tensor& expected, const Tensor& actual, Tolerance tol,
                         const std::vector<float>& magnitude = {}) {
  REQUIRE(expected.dtype() == actual.dtype());
  REQUIRE(expected.shape() == actual.shape());
  const std::vector<float> e = expected.to_float_vector(), a = actual.to_float_vector();
  const std::vector<uint32_t> e_bits = element_bits(expected), a_bits = element_bits(actual);
  const uint32_t poison = poison_bits(actual.dtype());
  REQUIRE((magnitude.empty() || magnitude.size() == e.size()));
  std::ostringstream report;
  int64_t mismatches = 0;
  for (size_t i = 0; i < e.size(); ++i) {
    bool ok;
    if (a_bits[i] == poison || e_bits[i] == poison) {
      ok = a_bits[i] == e_bits[i];
    } else if (std::isnan(e[i])) {
      ok = std::isnan(a[i]);
    } else if (std::isinf(e[i])) {
      ok = a[i] == e[i];
    } else {
      const double scale = std::fabs(e[i]) + (magnitude.empty() ? 0.0 : magnitude[i]);
      ok = std::fabs(static_cast<double>(a[i]) - e[i]) <= tol.atol + tol.rtol * scale;
    }
    if (ok) continue;
    if (++mismatches <= 5) {
      report << "element " << i << ": expected " << e[i] << ", got "
             << (a_bits[i] == poison ? std::string("the poison (unwritten)") : std::to_string(a[i]))
             << "\n";
    }
  }
  INFO(describe(actual) << ", rtol " << tol.rtol << ", atol " << tol.atol << ": " << mismatches
                        << " of " << e.size() << " elements differ\n"
                        << report.str());
  CHECK(mismatches == 0);
}

inline void expect_close(const Tensor& expected, const Tensor& actual) {
  expect_close(expected, actual, tolerance_for(expected.dtype()));
}

// The dtype tolerance of the output, widened by sqrt(terms) / 16 once more than 256 products
// are summed into one element (FP32 sums in different orders drift apart as sqrt(terms)).
inline Tolerance accumulation_tolerance(DType output, int64_t terms) {
  Tolerance t = tolerance_for(output);
  const double growth = std::max(1.0, std::sqrt(static_cast<double>(terms)) / 16.0);
  t.rtol *= growth;
  t.atol *= growth;
  return t;
}

// Element-wise |t| in F32: the magnitude of what a reduction sums, for expect_close.
inline Tensor abs_of(const Tensor& t) {
  std::vector<float> v = t.to_float_vector();
  for (float& x : v) x = std::fabs(x);
  return Tensor::from_vector(v, t.shape(), DType::F32);
}

}  // namespace mixprec::cuda_test
