#include "cuda/kernels/embedding.h"

#if defined(MIXPREC_CUDA_EMULATION)
#include "cuda/emulation/radix_sort_emulation.h"
#else
#include <cub/device/device_radix_sort.cuh>
#endif

#include "core/error.h"
#include "core/math/embedding_parts.h"
#include "cuda/kernels/common.cuh"

namespace mixprec::kernels {
namespace {

constexpr size_t kAlign = 256;

size_t round_up(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Bits that hold every id below `vocab` (at least 1).
int key_bits(int64_t vocab) {
  int bits = 1;
  while (bits < 32 && (int64_t{1} << bits) < vocab) ++bits;
  return bits;
}

// The scratch: sorted ids, positions before and after the sort, the start of every id's
// run of positions (vocab + 1 entries), the parts' sums when a row is split, then the radix
// sort's own temporary storage.
struct Layout {
  size_t sorted_ids, positions, sorted_positions, starts, partials, sort_temp, sort_temp_bytes,
      total;
  int64_t parts;
};

Layout layout_for(int64_t count, int64_t vocab, int64_t dim) {
  size_t sort_bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), static_cast<int>(count),
      0, key_bits(vocab)));
  Layout l{};
  const size_t ints = static_cast<size_t>(count) * sizeof(int32_t);
  l.sorted_ids = 0;
  l.positions = l.sorted_ids + round_up(ints);
  l.sorted_positions = l.positions + round_up(ints);
  l.starts = l.sorted_positions + round_up(ints);
  l.partials = l.starts + round_up(static_cast<size_t>(vocab + 1) * sizeof(int32_t));
  l.parts = embedding_backward_parts(count, vocab, dim);
  const size_t partial_floats = l.parts > 1 ? static_cast<size_t>(l.parts * vocab * dim) : 0;
  l.sort_temp = l.partials + round_up(partial_floats * sizeof(float));
  l.sort_temp_bytes = sort_bytes;
  l.total = l.sort_temp + round_up(sort_bytes);
  return l;
}

__global__ void __launch_bounds__(kThreads) iota_kernel(int32_t* out, int64_t n) {
  const int64_t stride = thread_stride();
  for (int64_t i = first_thread(); i < n; i += stride) out[i] = static_cast<int32_t>(i);
}

// starts[v] = the first index k of the sorted ids with sorted[k] >= v, for v in [0, vocab].
__global__ void __launch_bounds__(kThreads) run_starts_kernel(const uint32_t* sorted,
                                                             int64_t count, int64_t vocab,
                                                             int32_t* starts) {
  const int64_t stride = thread_stride();
  for (int64_t v = first_thread(); v <= vocab; v += stride) {
    int64_t low = 0, high = count;
    while (low < high) {
      const int64_t mid = (low + high) / 2;
      if (static_cast<int64_t>(sorted[mid]) < v) low = mid + 1;
      else high = mid;
    }
    starts[v] = static_cast<int32_t>(low);
  }
}

// One thread per part s and element (v, j) of dweight (core/math/embedding_parts.h):
// consecutive threads take consecutive columns, so the dy rows are read coalesced. With one
// part the sum is dweight's value; otherwise it goes to partials[s][v][j].
template <class T>
__global__ void __launch_bounds__(kThreads) gather_sum_kernel(const int32_t* starts,
                                                             const int32_t* positions,
                                                             const T* dy, T* dweight,
                                                             float* partials, int64_t parts,
                                                             int64_t vocab, int64_t dim) {
  const int64_t table = vocab * dim;
  const int64_t n = parts * table;
  const int64_t stride = thread_stride();
  for (int64_t i = first_thread(); i < n; i += stride) {
    const int64_t s = i / table, e = i % table;
    const int64_t v = e / dim, j = e % dim;
    const int64_t run = starts[v], length = starts[v + 1] - run;
    const int64_t end = run + embedding_part_begin(length, s + 1, parts);
    float acc = 0.0f;
    for (int64_t k = run + embedding_part_begin(length, s, parts); k < end; ++k)
      acc += to_float(dy[static_cast<int64_t>(positions[k]) * dim + j]);
    if (parts == 1) dweight[e] = from_float<T>(acc);
    else partials[i] = acc;
  }
}

// dweight[v][j] = the parts' sums added from 0 in part order, rounded once.
template <class T>
__global__ void __launch_bounds__(kThreads) parts_total_kernel(const float* partials,
                                                              int64_t parts, int64_t table,
                                                              T* dweight) {
  const int64_t stride = thread_stride();
  for (int64_t e = first_thread(); e < table; e += stride) {
    float total = 0.0f;
    for (int64_t s = 0; s < parts; ++s) total += partials[s * table + e];
    dweight[e] = from_float<T>(total);
  }
}

}  // namespace

size_t embedding_backward_scratch_bytes(int64_t count, int64_t vocab, int64_t dim) {
  return layout_for(count, vocab, dim).total;
}

void embedding_backward(DType dtype, const int32_t* ids, int64_t count, const void* dy,
                        void* dweight, int64_t vocab, int64_t dim, void* scratch,
                        size_t scratch_bytes, cudaStream_t stream) {
  if (vocab <= 0 || dim <= 0) return;
  MIXPREC_CHECK(count < INT32_MAX && vocab < INT32_MAX, "embedding_backward: ", count,
                " ids into ", vocab, " rows exceed the CUDA backend's 32-bit positions; split "
                "the batch");
  const Layout l = layout_for(count, vocab, dim);
  MIXPREC_CHECK(scratch_bytes >= l.total, "embedding_backward: scratch of ", scratch_bytes,
                " bytes is smaller than the ", l.total, " needed");
  auto* base = static_cast<unsigned char*>(scratch);
  auto* sorted_ids = reinterpret_cast<uint32_t*>(base + l.sorted_ids);
  auto* positions = reinterpret_cast<int32_t*>(base + l.positions);
  auto* sorted_positions = reinterpret_cast<int32_t*>(base + l.sorted_positions);
  auto* starts = reinterpret_cast<int32_t*>(base + l.starts);
  auto* partials = reinterpret_cast<float*>(base + l.partials);
  if (count > 0) {
    MIXPREC_LAUNCH(grid_for(count), kThreads, stream, iota_kernel)(positions, count);
    CUDA_CHECK_LAST();
    // Ids are validated non-negative, so their unsigned order is their order.
    size_t temp_bytes = l.sort_temp_bytes;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        base + l.sort_temp, temp_bytes, reinterpret_cast<const uint32_t*>(ids), sorted_ids,
        positions, sorted_positions, static_cast<int>(count), 0, key_bits(vocab), stream));
  }
  MIXPREC_LAUNCH(grid_for(vocab + 1), kThreads, stream, run_starts_kernel)(sorted_ids, count, vocab,
      starts);
  CUDA_CHECK_LAST();
  MIXPREC_CUDA_DISPATCH_FLOATING(dtype, "embedding_backward", [&] {
    auto* out = static_cast<scalar_t*>(dweight);
    MIXPREC_LAUNCH(grid_for(l.parts * vocab * dim), kThreads, stream, gather_sum_kernel)(starts,
        sorted_positions, static_cast<const scalar_t*>(dy), out, partials, l.parts, vocab, dim);
    CUDA_CHECK_LAST();
    if (l.parts > 1) {
      MIXPREC_LAUNCH(grid_for(vocab * dim), kThreads, stream, parts_total_kernel)(partials,
          l.parts, vocab * dim, out);
      CUDA_CHECK_LAST();
    }
  });
}

}  // namespace mixprec::kernels
