#include "core/shape.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"

namespace mixprec {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, d, &n))
      MIXPREC_FAIL("shape ", shape_str(shape), " has too many elements to count in 64 bits");
  return n;
}

std::string shape_str(const Shape& shape) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}

int64_t normalize_dim(int64_t dim, int64_t rank, const char* op) {
  const int64_t wrapped = dim < 0 ? dim + rank : dim;
  MIXPREC_CHECK(wrapped >= 0 && wrapped < rank, op, ": dimension ", dim,
                " is out of range for a tensor of rank ", rank);
  return wrapped;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    MIXPREC_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ",
                  shape_str(b), " cannot be broadcast together (extents ", da, " and ", db,
                  " in dimension ", static_cast<int64_t>(i) - static_cast<int64_t>(rank), ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

std::vector<int64_t> contiguous_strides(const Shape& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i)
    strides[i] = strides[i + 1] * shape[i + 1];
  return strides;
}

}  // namespace mixprec
