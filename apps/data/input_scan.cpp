#include "apps/data/input_scan.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace mixprec {
namespace {

// Whether one of the n floats at p is Inf or NaN (every exponent bit set): an OR over all of
// them without an early exit, which the compiler vectorises; a search that stops at the
// first hit does not, and costs five times as much on a batch of images.
bool any_nonfinite(const float* p, int64_t n) {
  uint32_t any = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, p + i, sizeof bits);
    any |= (bits & 0x7F800000u) == 0x7F800000u ? 1u : 0u;
  }
  return any != 0;
}

// The first element of `inputs` that is not finite, or -1. F32 is read in place (the common
// case, and the one that must stay cheap: it runs for every training batch, on the
// prefetcher's thread), in blocks that are searched only when any_nonfinite finds something
// in them; other floating dtypes through a float copy, which keeps Inf and NaN.
int64_t first_nonfinite(const Tensor& inputs, double& value) {
  const Tensor host = inputs.device().is_cpu() ? inputs : inputs.to(kCPU);
  const auto is_bad = [](float v) { return !std::isfinite(v); };
  if (host.dtype() == DType::F32) {
    constexpr int64_t kBlock = 16384;
    const float* data = host.data_as<float>();
    const int64_t n = host.numel();
    for (int64_t begin = 0; begin < n; begin += kBlock) {
      const int64_t count = std::min(kBlock, n - begin);
      if (!any_nonfinite(data + begin, count)) continue;
      const float* bad = std::find_if(data + begin, data + begin + count, is_bad);
      value = *bad;
      return bad - data;
    }
    return -1;
  }
  const std::vector<float> values = host.to_float_vector();
  const auto bad = std::find_if(values.begin(), values.end(), is_bad);
  if (bad == values.end()) return -1;
  value = *bad;
  return bad - values.begin();
}

}  // namespace

// first_nonfinite of the inputs; -1 for integer inputs (token ids), which are not checked.
InputScan scan_inputs(const Tensor& inputs) {
  InputScan scan;
  if (!is_floating(inputs.dtype())) return scan;
  scan.element = first_nonfinite(inputs, scan.value);
  return scan;
}

}  // namespace mixprec
