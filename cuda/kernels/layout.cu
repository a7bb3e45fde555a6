#include "cuda/kernels/layout.h"

#include <initializer_list>
#include <numeric>

#include "core/error.h"
#include "cuda/kernels/common.cuh"

namespace mixprec::kernels {
namespace {

template <class Index>
struct PermuteArgs {
  int ndim = 0;
  Index extents[kMaxDims] = {};
  Index xstrides[kMaxDims] = {};
};

// One output element per thread, in output order: writes are coalesced, and so are reads
// wherever the innermost output dim is contiguous in x.
template <class Word, class Index>
__global__ void __launch_bounds__(kThreads) permute_kernel(const Word* x, Word* y, Index n,
                                                          PermuteArgs<Index> a) {
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = x[offset_of(i, a.ndim, a.extents, a.xstrides)];
}

// Square tile of a transpose: the output's innermost dim is strided in x, and output dim
// `j` is the one contiguous in x.
constexpr int kTile = 32;
constexpr int kTileRows = kThreads / kTile;

template <class Index>
struct TransposeArgs {
  int outer_ndim = 0;
  Index outer_extents[kMaxDims] = {};
  Index outer_xstrides[kMaxDims] = {};
  Index outer_ystrides[kMaxDims] = {};
  Index rows = 0, cols = 0;   // output dim j (contiguous in x) and the innermost output dim
  Index ys_row = 0, xs_col = 0;
  Index row_tiles = 0, col_tiles = 0;
};

// Block per (outer index, 32 x 32 tile): reads the tile along x's contiguous dim and writes
// it along y's, through shared memory.
template <class Word, class Index>
__global__ void __launch_bounds__(kThreads) transpose_kernel(const Word* x, Word* y, Index tasks,
                                                            TransposeArgs<Index> a) {
  __shared__ Word tile[kTile][kTile + 1];
  const int tx = static_cast<int>(threadIdx.x) % kTile;
  const int ty = static_cast<int>(threadIdx.x) / kTile;
  const Index tiles = a.row_tiles * a.col_tiles;
  for (Index task = blockIdx.x; task < tasks; task += gridDim.x) {
    const Index o = task / tiles;
    const Index r0 = task % tiles / a.col_tiles * kTile;
    const Index c0 = task % a.col_tiles * kTile;
    const Index xo = offset_of(o, a.outer_ndim, a.outer_extents, a.outer_xstrides);
    const Index yo = offset_of(o, a.outer_ndim, a.outer_extents, a.outer_ystrides);
    // Read: consecutive threads take consecutive rows r (contiguous in x).
    for (int k = ty; k < kTile; k += kTileRows) {
      const Index r = r0 + tx, c = c0 + k;
      if (r < a.rows && c < a.cols) tile[k][tx] = x[xo + r + c * a.xs_col];
    }
    __syncthreads();
    // Write: consecutive threads take consecutive columns c (contiguous in y).
    for (int k = ty; k < kTile; k += kTileRows) {
      const Index r = r0 + k, c = c0 + tx;
      if (r < a.rows && c < a.cols) y[yo + r * a.ys_row + c] = tile[tx][k];
    }
    __syncthreads();
  }
}

// The tiled transpose of a plan whose innermost output dim is strided in x.
template <class Word, class Index>
void launch_transpose(const PermutePlan& plan, const Word* px, Word* py, cudaStream_t stream) {
  const size_t last = plan.extents.size() - 1;
  size_t j = 0;
  while (plan.xstrides[j] != 1) ++j;
  TransposeArgs<Index> a;
  int64_t outer = 1;
  for (size_t d = 0; d < last; ++d) {
    if (d == j) continue;
    a.outer_extents[a.outer_ndim] = static_cast<Index>(plan.extents[d]);
    a.outer_xstrides[a.outer_ndim] = static_cast<Index>(plan.xstrides[d]);
    a.outer_ystrides[a.outer_ndim] = static_cast<Index>(plan.ystrides[d]);
    ++a.outer_ndim;
    outer *= plan.extents[d];
  }
  a.rows = static_cast<Index>(plan.extents[j]);
  a.cols = static_cast<Index>(plan.extents[last]);
  a.ys_row = static_cast<Index>(plan.ystrides[j]);
  a.xs_col = static_cast<Index>(plan.xstrides[last]);
  a.row_tiles = (a.rows + kTile - 1) / kTile;
  a.col_tiles = (a.cols + kTile - 1) / kTile;
  const int64_t tasks = outer * static_cast<int64_t>(a.row_tiles) * a.col_tiles;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(tasks, kMaxBlocks));
  MIXPREC_LAUNCH(blocks, kThreads, stream, transpose_kernel<Word, Index>)(px, py,
      static_cast<Index>(tasks), a);
  CUDA_CHECK_LAST();
}

template <class Word, class Index>
void launch_permute(const PermutePlan& plan, const void* x, void* y, int64_t n,
                    cudaStream_t stream) {
  const size_t ndim = plan.extents.size();
  const size_t last = ndim - 1;
  const auto* px = static_cast<const Word*>(x);
  auto* py = static_cast<Word*>(y);
  if (plan.xstrides[last] == 1) {
    PermuteArgs<Index> a;
    a.ndim = static_cast<int>(ndim);
    for (size_t d = 0; d < ndim; ++d) {
      a.extents[d] = static_cast<Index>(plan.extents[d]);
      a.xstrides[d] = static_cast<Index>(plan.xstrides[d]);
    }
    MIXPREC_LAUNCH(grid_for(n), kThreads, stream, permute_kernel<Word, Index>)(px, py,
        static_cast<Index>(n), a);
    CUDA_CHECK_LAST();
    return;
  }
  // Words wider than an element move only runs contiguous in x, which the walk above takes,
  // so the transpose (and its shared tile) exists for element-sized words only.
  if constexpr (sizeof(Word) <= 4) {
    launch_transpose<Word, Index>(plan, px, py, stream);
  } else {
    MIXPREC_FAIL("permute: ", sizeof(Word), "-byte words need the innermost output dim "
                 "contiguous in x");
  }
}

template <class Word>
__global__ void __launch_bounds__(kThreads) copy_rows_kernel(const Word* src, int64_t src_pitch,
                                                            const int32_t* row_ids, Word* dst,
                                                            int64_t dst_pitch, int64_t row_words,
                                                            int64_t words) {
  const int64_t stride = thread_stride();
  for (int64_t i = first_thread(); i < words; i += stride) {
    const int64_t r = i / row_words, c = i % row_words;
    const int64_t from = row_ids != nullptr ? row_ids[r] : r;
    dst[r * dst_pitch + c] = src[from * src_pitch + c];
  }
}

template <class Word>
void launch_copy_rows(const void* src, size_t src_pitch, const int32_t* row_ids, void* dst,
                      size_t dst_pitch, size_t row_bytes, int64_t rows, cudaStream_t stream) {
  const int64_t row_words = static_cast<int64_t>(row_bytes / sizeof(Word));
  const int64_t words = rows * row_words;
  MIXPREC_LAUNCH(grid_for(words), kThreads, stream, copy_rows_kernel<Word>)(
      static_cast<const Word*>(src), static_cast<int64_t>(src_pitch / sizeof(Word)), row_ids,
      static_cast<Word*>(dst), static_cast<int64_t>(dst_pitch / sizeof(Word)), row_words, words);
  CUDA_CHECK_LAST();
}

// Word i of q's index space [B, H, T, row words] (and of k's and v's) lies at word
// packed_word(i) of qkv [B, T, 3, H, row words], k's `part` words and v's 2 * part further.
struct HeadsIndex {
  int64_t time, heads, row_words;
  __device__ __forceinline__ int64_t packed_word(int64_t i) const {
    const int64_t r = i / row_words, c = i % row_words;
    const int64_t t = r % time, head = r / time % heads, b = r / (time * heads);
    return ((b * time + t) * 3 * heads + head) * row_words + c;
  }
  __device__ __forceinline__ int64_t part() const { return heads * row_words; }
};

// One thread per word of q's index space, moving the same word of q, k and v: the D-element
// rows are contiguous in both layouts, so reads and writes coalesce.
template <class Word>
__global__ void __launch_bounds__(kThreads) split_heads_kernel(const Word* qkv, Word* q, Word* k,
                                                              Word* v, HeadsIndex at,
                                                              int64_t words) {
  const int64_t stride = thread_stride();
  for (int64_t i = first_thread(); i < words; i += stride) {
    const Word* packed = qkv + at.packed_word(i);
    q[i] = packed[0];
    k[i] = packed[at.part()];
    v[i] = packed[2 * at.part()];
  }
}

template <class Word>
__global__ void __launch_bounds__(kThreads) merge_heads_kernel(const Word* q, const Word* k,
                                                              const Word* v, Word* qkv,
                                                              HeadsIndex at, int64_t words) {
  const int64_t stride = thread_stride();
  for (int64_t i = first_thread(); i < words; i += stride) {
    Word* packed = qkv + at.packed_word(i);
    packed[0] = q[i];
    packed[at.part()] = k[i];
    packed[2 * at.part()] = v[i];
  }
}

// The widest of 16, 8 and 4 bytes that every size in `sizes` is a multiple of and every
// pointer is aligned to; `narrowest` when none is.
size_t widest_word(std::initializer_list<size_t> sizes,
                   std::initializer_list<const void*> pointers, size_t narrowest) {
  for (const size_t word : {size_t{16}, size_t{8}, size_t{4}}) {
    if (word <= narrowest) break;
    bool fits = true;
    for (const size_t size : sizes) fits = fits && size % word == 0;
    for (const void* p : pointers) fits = fits && aligned_to(p, word);
    if (fits) return word;
  }
  return narrowest;
}

// Calls launch(Word{}) with the unsigned word type of `bytes` (16, 8, 4 or 2).
template <class Launch>
void with_word(size_t bytes, const Launch& launch) {
  switch (bytes) {
    case 16: launch(uint4{}); break;
    case 8: launch(uint2{}); break;
    case 4: launch(uint32_t{}); break;
    default: launch(uint16_t{}); break;
  }
}

// Calls launch(Word{}, index, words) with the widest word (up to 16 bytes) that the row
// length and every pointer allow.
template <class Launch>
void with_heads_word(std::initializer_list<const void*> pointers, int64_t batch, int64_t time,
                     int64_t heads, size_t row_bytes, const Launch& launch) {
  with_word(widest_word({row_bytes}, pointers, 2), [&](auto word) {
    const int64_t row_words = static_cast<int64_t>(row_bytes / sizeof(word));
    launch(word, HeadsIndex{time, heads, row_words}, batch * time * heads * row_words);
  });
}

// `plan` counted in words of `ratio` elements (permute_word_bytes's conditions hold).
PermutePlan in_words(PermutePlan plan, int64_t ratio) {
  const size_t last = plan.extents.size() - 1;
  plan.extents[last] /= ratio;
  for (size_t d = 0; d < last; ++d) plan.xstrides[d] /= ratio;
  for (size_t d = last; d-- > 0;) plan.ystrides[d] = plan.ystrides[d + 1] * plan.extents[d + 1];
  return plan;
}

template <class Word>
void launch_permute_words(const PermutePlan& plan, const void* x, void* y, int64_t n,
                          cudaStream_t stream) {
  // The largest input offset is below n, so 32-bit indices do whenever n fits.
  if (fits_32_bits(n)) launch_permute<Word, uint32_t>(plan, x, y, n, stream);
  else launch_permute<Word, uint64_t>(plan, x, y, n, stream);
}

}  // namespace

size_t permute_word_bytes(const PermutePlan& plan, size_t element_size, const void* x,
                          const void* y) {
  const size_t last = plan.extents.size() - 1;
  if (plan.xstrides[last] != 1) return element_size;
  // A word divides the run and every outer stride exactly when it divides their gcd.
  size_t common = static_cast<size_t>(plan.extents[last]) * element_size;
  for (size_t d = 0; d < last; ++d)
    common = std::gcd(common, static_cast<size_t>(plan.xstrides[d]) * element_size);
  return widest_word({common}, {x, y}, element_size);
}

void permute(const PermutePlan& plan, size_t element_size, const void* x, void* y, int64_t n,
             cudaStream_t stream) {
  if (n <= 0) return;
  MIXPREC_CHECK(plan.extents.size() <= static_cast<size_t>(kMaxDims), "permute: the permutation "
                "needs ", plan.extents.size(), " dimensions after merging, more than the CUDA "
                "backend's ", kMaxDims, "; reshape the tensor to fewer dimensions");
  MIXPREC_CHECK(element_size == 2 || element_size == 4, "permute: unsupported element size ",
                element_size);
  const size_t word = permute_word_bytes(plan, element_size, x, y);
  const int64_t ratio = static_cast<int64_t>(word / element_size);
  const PermutePlan words = ratio > 1 ? in_words(plan, ratio) : plan;
  const int64_t count = n / ratio;
  with_word(word, [&](auto w) { launch_permute_words<decltype(w)>(words, x, y, count, stream); });
}

void copy_rows(const void* src, size_t src_pitch, const int32_t* row_ids, void* dst,
               size_t dst_pitch, size_t row_bytes, int64_t rows, cudaStream_t stream) {
  if (rows <= 0 || row_bytes == 0) return;
  with_word(widest_word({src_pitch, dst_pitch, row_bytes}, {src, dst}, 2), [&](auto word) {
    launch_copy_rows<decltype(word)>(src, src_pitch, row_ids, dst, dst_pitch, row_bytes, rows,
                                     stream);
  });
}

void split_heads(const void* qkv, void* const (&parts)[3], int64_t batch, int64_t time,
                 int64_t heads, size_t row_bytes, cudaStream_t stream) {
  if (batch * time * heads <= 0 || row_bytes == 0) return;
  with_heads_word({qkv, parts[0], parts[1], parts[2]}, batch, time, heads, row_bytes,
                  [&](auto word, HeadsIndex at, int64_t words) {
                    using Word = decltype(word);
                    MIXPREC_LAUNCH(grid_for(words), kThreads, stream, split_heads_kernel<Word>)(
                        static_cast<const Word*>(qkv), static_cast<Word*>(parts[0]),
                        static_cast<Word*>(parts[1]), static_cast<Word*>(parts[2]), at, words);
                    CUDA_CHECK_LAST();
                  });
}

void merge_heads(const void* const (&parts)[3], void* qkv, int64_t batch, int64_t time,
                 int64_t heads, size_t row_bytes, cudaStream_t stream) {
  if (batch * time * heads <= 0 || row_bytes == 0) return;
  with_heads_word({qkv, parts[0], parts[1], parts[2]}, batch, time, heads, row_bytes,
                  [&](auto word, HeadsIndex at, int64_t words) {
                    using Word = decltype(word);
                    MIXPREC_LAUNCH(grid_for(words), kThreads, stream, merge_heads_kernel<Word>)(
                        static_cast<const Word*>(parts[0]), static_cast<const Word*>(parts[1]),
                        static_cast<const Word*>(parts[2]), static_cast<Word*>(qkv), at, words);
                    CUDA_CHECK_LAST();
                  });
}

}  // namespace mixprec::kernels
