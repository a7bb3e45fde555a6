// Layout primitives of the CPU backend: permute, copy_narrow and the q/k/v heads split and
// merge. All move whole elements without arithmetic, so they work on raw 2- or 4-byte words
// (or bytes) and serve every dtype, I32 included.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/backend_checks.h"
#include "core/cpu/common.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/strided.h"
#include "core/math/broadcast.h"
#include "core/tensor.h"

namespace mixprec {
namespace {

using cpu::kParallelWork;

// Calls move(s, packed, split, row_bytes) for every D-element row of one head of one
// position: its byte offset `packed` in qkv [B, T, 3, H, D] and `split` in the [B, H, T, D]
// tensor s (0 = q, 1 = k, 2 = v).
template <class Move>
void for_each_head_row(const backend_checks::Heads& h, size_t esize, const Move& move) {
  const int64_t rows = h.batch * h.time;
  const size_t row_bytes = static_cast<size_t>(h.dim) * esize;
#pragma omp parallel for if (rows * 3 * h.heads * h.dim > kParallelWork)
  for (int64_t bt = 0; bt < rows; ++bt) {
    const int64_t b = bt / h.time, t = bt % h.time;
    for (int s = 0; s < 3; ++s) {
      for (int64_t head = 0; head < h.heads; ++head) {
        move(s, static_cast<size_t>((bt * 3 + s) * h.heads + head) * row_bytes,
             static_cast<size_t>((b * h.heads + head) * h.time + t) * row_bytes, row_bytes);
      }
    }
  }
}

// Square tile of a transpose whose innermost output dim is strided in the input: both the
// reads and the writes of one tile then stay within a few cache lines per row.
constexpr int64_t kTile = 32;

template <class Word>
void permute_words(const Word* x, Word* y, const PermutePlan& plan, int64_t n) {
  const size_t last = plan.extents.size() - 1;
  const int64_t inner = plan.extents[last];
  if (plan.xstrides[last] == 1) {
    // The innermost run is contiguous in both: one memcpy per output row.
    const std::vector<int64_t> outer_ext(plan.extents.begin(), plan.extents.end() - 1);
    const std::vector<int64_t> outer_xs(plan.xstrides.begin(), plan.xstrides.end() - 1);
    const int64_t rows = n / inner;
#pragma omp parallel for if (n > kParallelWork)
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(y + r * inner, x + cpu::offset_of(r, outer_ext, outer_xs), inner * sizeof(Word));
    return;
  }
  // A transpose: the output dim `j` is the one contiguous in x. Tile the (j, last) plane.
  size_t j = 0;
  while (plan.xstrides[j] != 1) ++j;
  std::vector<int64_t> outer_ext, outer_xs, outer_ys;
  for (size_t d = 0; d < last; ++d) {
    if (d == j) continue;
    outer_ext.push_back(plan.extents[d]);
    outer_xs.push_back(plan.xstrides[d]);
    outer_ys.push_back(plan.ystrides[d]);
  }
  const int64_t rows = plan.extents[j], cols = inner;
  const int64_t ys_row = plan.ystrides[j], xs_col = plan.xstrides[last];
  const int64_t outer = shape_numel(outer_ext);
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  const int64_t tasks = outer * row_tiles;
#pragma omp parallel for if (n > kParallelWork)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t o = t / row_tiles;
    const int64_t r0 = (t % row_tiles) * kTile, r1 = std::min(rows, r0 + kTile);
    const Word* px = x + cpu::offset_of(o, outer_ext, outer_xs);
    Word* py = y + cpu::offset_of(o, outer_ext, outer_ys);
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t c1 = std::min(cols, c0 + kTile);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) py[r * ys_row + c] = px[r + c * xs_col];
    }
  }
}

// The threshold counts bytes: those of kParallelWork 4-byte elements.
void copy_rows(const char* src, char* dst, int64_t outer, int64_t src_row, int64_t dst_row,
               int64_t bytes) {
#pragma omp parallel for if (outer * bytes > 4 * kParallelWork)
  for (int64_t o = 0; o < outer; ++o) std::memcpy(dst + o * dst_row, src + o * src_row, bytes);
}

}  // namespace

void CpuBackend::permute(const Tensor& x, const std::vector<int64_t>& perm, Tensor& y) {
  backend_checks::permute(kCPU, x, perm, y);
  const int64_t n = x.numel();
  if (n == 0) return;
  const PermutePlan plan = plan_permute(x.shape(), perm);
  if (dtype_size(x.dtype()) == 2)
    permute_words(static_cast<const uint16_t*>(x.data()), static_cast<uint16_t*>(y.data()), plan, n);
  else
    permute_words(static_cast<const uint32_t*>(x.data()), static_cast<uint32_t*>(y.data()), plan, n);
}

void CpuBackend::copy_narrow(const Tensor& src, int64_t dim, int64_t src_start, Tensor& dst,
                             int64_t dst_start, int64_t length) {
  backend_checks::copy_narrow(kCPU, src, dim, src_start, dst, dst_start, length);
  const int64_t rank = src.dim();
  const int64_t src_extent = src.shape()[dim], dst_extent = dst.shape()[dim];
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= src.shape()[d];
  for (int64_t d = dim + 1; d < rank; ++d) inner *= src.shape()[d];
  if (outer * inner * length == 0) return;
  const int64_t count = length * inner;
  const int64_t src_row = src_extent * inner, dst_row = dst_extent * inner;
  const int64_t esize = static_cast<int64_t>(dtype_size(src.dtype()));
  copy_rows(static_cast<const char*>(src.data()) + src_start * inner * esize,
            static_cast<char*>(dst.data()) + dst_start * inner * esize, outer, src_row * esize,
            dst_row * esize, count * esize);
}

void CpuBackend::split_heads(const Tensor& qkv, Tensor& q, Tensor& k, Tensor& v) {
  const backend_checks::Heads h = backend_checks::heads("split_heads", kCPU, qkv, q, k, v);
  if (q.numel() == 0) return;
  const auto* from = static_cast<const char*>(qkv.data());
  char* const to[3] = {static_cast<char*>(q.data()), static_cast<char*>(k.data()),
                       static_cast<char*>(v.data())};
  for_each_head_row(h, dtype_size(qkv.dtype()), [&](int s, size_t packed, size_t split,
                                                    size_t n) {
    std::memcpy(to[s] + split, from + packed, n);
  });
}

void CpuBackend::merge_heads(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& qkv) {
  const backend_checks::Heads h = backend_checks::heads("merge_heads", kCPU, qkv, q, k, v);
  if (q.numel() == 0) return;
  const char* const from[3] = {static_cast<const char*>(q.data()),
                               static_cast<const char*>(k.data()),
                               static_cast<const char*>(v.data())};
  auto* to = static_cast<char*>(qkv.data());
  for_each_head_row(h, dtype_size(qkv.dtype()), [&](int s, size_t packed, size_t split,
                                                    size_t n) {
    std::memcpy(to + packed, from[s] + split, n);
  });
}

}  // namespace mixprec
