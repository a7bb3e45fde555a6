// Internal to core/ops: the checks of dimension arguments and of spatial extents that ops
// share. A negative dimension counts from the end, as in PyTorch; the range check is
// normalize_dim's (core/shape.h) and the messages add the tensor's dtype and shape.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/shape.h"
#include "core/tensor.h"

namespace mixprec::ops {

// `dim` wrapped into [0, x.dim()).
inline int64_t wrap_dim(const char* op, int64_t dim, const Tensor& x) {
  try {
    return normalize_dim(dim, x.dim(), op);
  } catch (const Error& e) {
    MIXPREC_FAIL(e.what(), " (", describe(x), ")");
  }
}

// Every entry of `dims` wrapped into [0, x.dim()), in order. A dimension named twice (e.g. 1
// and -1 of a 2-D tensor) throws.
inline std::vector<int64_t> normalize_dims(const char* op, const std::vector<int64_t>& dims,
                                           const Tensor& x) {
  std::vector<int64_t> wrapped(dims.size());
  std::vector<bool> seen(static_cast<size_t>(x.dim()), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    wrapped[i] = wrap_dim(op, dims[i], x);
    MIXPREC_CHECK(!seen[wrapped[i]], op, ": dimension ", dims[i], " appears more than once in ",
                  shape_str(dims), " for ", describe(x));
    seen[wrapped[i]] = true;
  }
  return wrapped;
}

// A kernel_h x kernel_w window (of `weight` when given) must fit the spatial dims (2 and 3)
// of the NCHW x padded by `padding` on every side: otherwise the output would be empty.
inline void check_window_fits(const char* op, const Tensor& x, int64_t kernel_h,
                              int64_t kernel_w, int64_t padding,
                              const Tensor* weight = nullptr) {
  const int64_t padded_h = x.size(2) + 2 * padding, padded_w = x.size(3) + 2 * padding;
  if (padded_h >= kernel_h && padded_w >= kernel_w) return;
  MIXPREC_FAIL(op, ": kernel ", kernel_h, "x", kernel_w,
               weight ? " of weight " + describe(*weight) : std::string(),
               " is larger than the padded input ", padded_h, "x", padded_w, " of ",
               describe(x), " (padding ", padding, "), so the output would be empty");
}

}  // namespace mixprec::ops
