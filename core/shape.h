// Shapes of contiguous row-major tensors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mixprec {

using Shape = std::vector<int64_t>;

// Product of the extents; 1 for a scalar (empty shape). Throws when it overflows int64.
int64_t shape_numel(const Shape& shape);
// "[2, 3, 4]".
std::string shape_str(const Shape& shape);
// Wraps a possibly negative dimension into [0, rank); throws naming `op` when out of range.
int64_t normalize_dim(int64_t dim, int64_t rank, const char* op);
// NumPy broadcasting of two shapes; throws naming `op`, both shapes, and the first
// mismatched extents with their dimension counted from the end (-1 is the last).
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// Row-major strides (in elements) of a contiguous tensor of `shape`.
std::vector<int64_t> contiguous_strides(const Shape& shape);

}  // namespace mixprec
