// Index arithmetic over strided views that the CPU kernels share.
#pragma once

#include <cstdint>
#include <vector>

namespace mixprec::cpu {

// Element offset of the `index`-th point of a row-major walk over `extents` (index in
// [0, product of extents)) when dim d advances by strides[d] elements. extents and strides
// have one length; a stride may be 0 (a broadcast dim).
inline int64_t offset_of(int64_t index, const std::vector<int64_t>& extents,
                         const std::vector<int64_t>& strides) {
  int64_t off = 0;
  for (size_t d = extents.size(); d-- > 0;) {
    off += (index % extents[d]) * strides[d];
    index /= extents[d];
  }
  return off;
}

}  // namespace mixprec::cpu
