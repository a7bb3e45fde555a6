// Index arithmetic of strided walks, shared by the CPU and CUDA backends: the broadcast plan
// of an output and the inputs that broadcast to it, sum_to's split of its input's dims, the
// plan of a permutation, and the offset of a point of such a walk. Plans are made once per
// call on the host; offset_of runs in kernels of both backends.
//
// A plan drops the output's extent-1 dims and merges adjacent dims that every operand walks
// in step, so the common cases (equal shapes, a bias over the last dims, a [N, 1] column, a
// permutation that keeps runs of dims together) become one or two dims whose innermost run
// is contiguous or constant.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "core/hd.h"
#include "core/shape.h"

namespace mixprec {

// Element offset of the `index`-th point of a row-major walk over extents[0, ndim) when dim d
// advances by strides[d] elements (a stride may be 0: a broadcast dim).
template <class Index>
MIXPREC_HD Index offset_of(Index index, int ndim, const Index* extents, const Index* strides) {
  Index off = 0;
  for (int d = ndim - 1; d >= 0; --d) {
    off += (index % extents[d]) * strides[d];
    index /= extents[d];
  }
  return off;
}

// Coalesced iteration space of an output and N inputs that broadcast to it.
template <int N>
struct BroadcastPlan {
  std::vector<int64_t> extents;                 // outermost first; never empty
  std::array<std::vector<int64_t>, N> strides;  // per input, in elements; 0 where broadcast
};

// Every input shape broadcasts to `out` (right-aligned; each extent 1 or equal).
template <int N>
BroadcastPlan<N> plan_broadcast(const Shape& out, const std::array<const Shape*, N>& ins) {
  const size_t rank = out.size();
  std::array<std::vector<int64_t>, N> aligned;
  for (int k = 0; k < N; ++k) {
    const Shape& s = *ins[k];
    aligned[k].assign(rank, 0);
    int64_t stride = 1;
    for (size_t i = s.size(); i-- > 0;) {
      aligned[k][i + rank - s.size()] = s[i] == 1 ? 0 : stride;
      stride *= s[i];
    }
  }
  BroadcastPlan<N> plan;
  for (size_t d = 0; d < rank; ++d) {
    if (out[d] == 1) continue;
    bool merge = !plan.extents.empty();
    for (int k = 0; k < N && merge; ++k) merge = plan.strides[k].back() == aligned[k][d] * out[d];
    if (merge) {
      plan.extents.back() *= out[d];
      for (int k = 0; k < N; ++k) plan.strides[k].back() = aligned[k][d];
    } else {
      plan.extents.push_back(out[d]);
      for (int k = 0; k < N; ++k) plan.strides[k].push_back(aligned[k][d]);
    }
  }
  if (plan.extents.empty()) {
    plan.extents.push_back(1);
    for (int k = 0; k < N; ++k) plan.strides[k].push_back(0);
  }
  return plan;
}

// The walk of sum_to (y's shape broadcasts to x's) over x's merged dims, outermost first,
// split into the dims y keeps and the dims summed over, each with its stride in contiguous x.
// Merging never joins a summed dim with a kept one (their strides in y differ), so the
// innermost merged dim is wholly kept or wholly summed: the last of reduced_* when
// inner_reduced, else the last of kept_*.
struct SumToDims {
  std::vector<int64_t> kept_extents, kept_strides;
  std::vector<int64_t> reduced_extents, reduced_strides;
  int64_t inner = 1;  // extent of the innermost merged dim
  bool inner_reduced = false;

  // Removes the innermost dim from its list, for walks that run along it themselves.
  void drop_inner() {
    std::vector<int64_t>& extents = inner_reduced ? reduced_extents : kept_extents;
    std::vector<int64_t>& strides = inner_reduced ? reduced_strides : kept_strides;
    extents.pop_back();
    strides.pop_back();
  }
};

inline SumToDims split_sum_to(const Shape& x_shape, const Shape& y_shape) {
  const BroadcastPlan<1> walk = plan_broadcast<1>(x_shape, {&y_shape});
  const std::vector<int64_t>& extents = walk.extents;
  const std::vector<int64_t>& y_strides = walk.strides[0];
  const size_t ndim = extents.size();
  std::vector<int64_t> x_strides(ndim, 1);
  for (size_t d = ndim - 1; d-- > 0;) x_strides[d] = x_strides[d + 1] * extents[d + 1];
  SumToDims dims;
  for (size_t d = 0; d < ndim; ++d) {
    const bool kept = y_strides[d] != 0;
    (kept ? dims.kept_extents : dims.reduced_extents).push_back(extents[d]);
    (kept ? dims.kept_strides : dims.reduced_strides).push_back(x_strides[d]);
  }
  dims.inner = extents[ndim - 1];
  dims.inner_reduced = y_strides[ndim - 1] == 0;
  return dims;
}

// y = x permuted (y.shape[i] == x.shape[perm[i]]), as a walk over y's dims of extent > 1
// with the stride each has in x and in y; adjacent dims are merged when they are adjacent and
// in order in x too.
struct PermutePlan {
  std::vector<int64_t> extents;  // never empty
  std::vector<int64_t> xstrides;
  std::vector<int64_t> ystrides;
};

inline PermutePlan plan_permute(const Shape& xshape, const std::vector<int64_t>& perm) {
  const std::vector<int64_t> xs = contiguous_strides(xshape);
  PermutePlan plan;
  for (size_t i = 0; i < perm.size(); ++i) {
    const int64_t extent = xshape[perm[i]];
    if (extent == 1) continue;
    const int64_t stride = xs[perm[i]];
    if (!plan.extents.empty() && plan.xstrides.back() == stride * extent) {
      plan.extents.back() *= extent;
      plan.xstrides.back() = stride;
    } else {
      plan.extents.push_back(extent);
      plan.xstrides.push_back(stride);
    }
  }
  if (plan.extents.empty()) {
    plan.extents.push_back(1);
    plan.xstrides.push_back(1);
  }
  plan.ystrides.assign(plan.extents.size(), 1);
  for (size_t d = plan.extents.size() - 1; d-- > 0;)
    plan.ystrides[d] = plan.ystrides[d + 1] * plan.extents[d + 1];
  return plan;
}

}  // namespace mixprec
