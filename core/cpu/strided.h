// Index arithmetic over strided views that the CPU kernels share: core/math/broadcast.h's
// offset_of over the plans' std::vector extents and strides.
#pragma once

#include <cstdint>
#include <vector>

#include "core/math/broadcast.h"

namespace mixprec::cpu {

// Element offset of the `index`-th point of a row-major walk over `extents` (index in
// [0, product of extents)) when dim d advances by strides[d] elements. extents and strides
// have one length; a stride may be 0 (a broadcast dim).
inline int64_t offset_of(int64_t index, const std::vector<int64_t>& extents,
                         const std::vector<int64_t>& strides) {
  return mixprec::offset_of<int64_t>(index, static_cast<int>(extents.size()), extents.data(),
                                     strides.data());
}

}  // namespace mixprec::cpu
