// The convolution GEMM (core/cpu/tile_gemm.h). The AVX-512 kernel keeps a tile of
// kRows x (16 * kVectors) outputs of c in 24 vector registers for the whole k loop: each step
// loads one row of b's tile (kVectors vectors, the last one masked at c's right edge) and
// broadcasts kRows values of a column of a, then issues kRows * kVectors FMAs. b is read in
// place, row by row, and a through its strides, so nothing is packed: for the small
// per-image products of a convolution the packing that a general GEMM does costs about as
// much as the multiply-adds. Measured on one Zen 4 core for the 64 x 196 x 288 product of a
// 3x3 convolution of 32 channels: 105 GFLOP/s against Eigen's 81.
//
// The rows of b come from a policy: DenseRows (a row-major matrix) or TableRows (runs of one
// buffer at per-row offsets: the implicit column matrix of a convolution).
#include "core/cpu/tile_gemm.h"
#include "core/cpu/transpose8x8.h"

#include <omp.h>

#include <algorithm>
#include <atomic>

#include "core/cpu/cpu_gemm.h"
#include "core/error.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MIXPREC_TILE_GEMM_X86 1
#include <immintrin.h>
#else
#define MIXPREC_TILE_GEMM_X86 0
#endif

namespace mixprec::cpu {
namespace {

// set_tile_gemm_vectorised's switch.
std::atomic<bool> vectorised_allowed{true};

#if MIXPREC_TILE_GEMM_X86

// AVX-512F for the kernel, AVX-512VL for its masked 8-lane form (every AVX-512 CPU since
// Skylake-SP has both).
bool cpu_has_avx512() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
  }();
  return has;
}

constexpr int kRows = 6;     // rows of a tile
constexpr int kVectors = 4;  // 16-float vectors across a tile: 64 columns
constexpr int kWidth = 16;
// Multiply-adds below which a product stays on the calling thread.
constexpr int64_t kParallelTileWork = int64_t{1} << 20;

enum class Start { Zero, Accumulate, RowInit };

// b as a row-major matrix with leading dimension ld: every lane of a row exists.
struct DenseRows {
  const float* data;
  int64_t ld;
  struct Row {
    const float* values;
  };
  Row row(int64_t p, int64_t col) const { return {data + p * ld + col}; }
  static __mmask16 lanes(const Row&, int) { return 0xFFFF; }
};

// b as tile_gemm.h's OffsetRows. The pointers are held by value: through a reference GCC
// reloads them on every step of the k loop.
struct TableRows {
  const float* base;
  const int64_t* offsets;
  struct Row {
    const float* values;
  };
  Row row(int64_t p, int64_t col) const { return {base + offsets[p] + col}; }
  static __mmask16 lanes(const Row&, int) { return 0xFFFF; }
};

// Where row r of a starts.
inline const float* a_row(const StridedMatrix& a, int64_t r) {
  return a.data + (a.row_offsets ? a.row_offsets[r] : r * a.row_stride);
}

// The rows of a from row `first` on, as an operand of their own.
inline StridedMatrix a_rows_from(const StridedMatrix& a, int64_t first) {
  if (a.row_offsets) return {a.data, a.row_stride, a.col_stride, a.row_offsets + first};
  return {a.data + first * a.row_stride, a.row_stride, a.col_stride, nullptr};
}

// One tile of rows x (16 * vectors) outputs at c (columns from col); `tail` selects the
// columns of the last vector that exist. The loops have constant trip counts and are
// unrolled, so that acc lives in registers (rolled, GCC keeps the array on the stack and
// stores it every step).
template <int kTileRows, int kTileVectors, class B>
__attribute__((target("avx512f,avx512vl,fma"))) void tile(int64_t k, StridedMatrix a, const B& b,
                                                      int64_t col, float* c, int64_t ldc,
                                                      Start start, const float* row_init,
                                                      __mmask16 tail) {
  __m512 acc[kTileRows][kTileVectors];
#pragma GCC unroll 8
  for (int r = 0; r < kTileRows; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < kTileVectors; ++v) {
      const __mmask16 m = v == kTileVectors - 1 ? tail : __mmask16(0xFFFF);
      if (start == Start::Accumulate) {
        acc[r][v] = _mm512_maskz_loadu_ps(m, c + r * ldc + v * kWidth);
      } else if (start == Start::RowInit) {
        acc[r][v] = _mm512_set1_ps(row_init[r]);
      } else {
        acc[r][v] = _mm512_setzero_ps();
      }
    }
  }
  const float* a_rows[kTileRows];
#pragma GCC unroll 8
  for (int r = 0; r < kTileRows; ++r) a_rows[r] = a_row(a, r);
  for (int64_t p = 0; p < k; ++p) {
    const typename B::Row row = b.row(p, col);
    __m512 bv[kTileVectors];
#pragma GCC unroll 8
    for (int v = 0; v < kTileVectors; ++v) {
      const __mmask16 m = v == kTileVectors - 1 ? tail : __mmask16(0xFFFF);
      bv[v] = _mm512_maskz_loadu_ps(m & B::lanes(row, v), row.values + v * kWidth);
    }
    const int64_t at = p * a.col_stride;
#pragma GCC unroll 8
    for (int r = 0; r < kTileRows; ++r) {
      const __m512 av = _mm512_set1_ps(a_rows[r][at]);
#pragma GCC unroll 8
      for (int v = 0; v < kTileVectors; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kTileRows; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < kTileVectors; ++v) {
      const __mmask16 m = v == kTileVectors - 1 ? tail : __mmask16(0xFFFF);
      _mm512_mask_storeu_ps(c + r * ldc + v * kWidth, m, acc[r][v]);
    }
  }
}

// The tile kernel for a last panel of at most 8 columns: one 8-lane vector per row. Zen 4
// issues two 8-lane FMAs per cycle but one 16-lane one, so a narrow remainder (the 4 columns
// left of the 196 pixels of a 14x14 image) costs half as much as a masked 16-lane vector.
template <int kTileRows, class B>
__attribute__((target("avx512f,avx512vl,fma"))) void narrow_tile(int64_t k, StridedMatrix a,
                                                             const B& b, int64_t col, float* c,
                                                             int64_t ldc, Start start,
                                                             const float* row_init,
                                                             __mmask8 tail) {
  __m256 acc[kTileRows];
#pragma GCC unroll 8
  for (int r = 0; r < kTileRows; ++r) {
    if (start == Start::Accumulate) {
      acc[r] = _mm256_maskz_loadu_ps(tail, c + r * ldc);
    } else if (start == Start::RowInit) {
      acc[r] = _mm256_set1_ps(row_init[r]);
    } else {
      acc[r] = _mm256_setzero_ps();
    }
  }
  const float* a_rows[kTileRows];
#pragma GCC unroll 8
  for (int r = 0; r < kTileRows; ++r) a_rows[r] = a_row(a, r);
  for (int64_t p = 0; p < k; ++p) {
    const typename B::Row row = b.row(p, col);
    const __mmask8 m = tail & static_cast<__mmask8>(B::lanes(row, 0));
    const __m256 bv = _mm256_maskz_loadu_ps(m, row.values);
    const int64_t at = p * a.col_stride;
#pragma GCC unroll 8
    for (int r = 0; r < kTileRows; ++r)
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(a_rows[r][at]), bv, acc[r]);
  }
#pragma GCC unroll 8
  for (int r = 0; r < kTileRows; ++r) _mm256_mask_storeu_ps(c + r * ldc, tail, acc[r]);
}

// A tile of `rows` (1 .. kRows) rows: the row count is a template argument of the kernel.
template <int kTileVectors, class B>
__attribute__((target("avx512f,avx512vl,fma"))) void tile_rows(int64_t rows, int64_t k,
                                                           StridedMatrix a, const B& b,
                                                           int64_t col, float* c, int64_t ldc,
                                                           Start start, const float* row_init,
                                                           __mmask16 tail) {
  switch (rows) {
    case 6: return tile<6, kTileVectors>(k, a, b, col, c, ldc, start, row_init, tail);
    case 5: return tile<5, kTileVectors>(k, a, b, col, c, ldc, start, row_init, tail);
    case 4: return tile<4, kTileVectors>(k, a, b, col, c, ldc, start, row_init, tail);
    case 3: return tile<3, kTileVectors>(k, a, b, col, c, ldc, start, row_init, tail);
    case 2: return tile<2, kTileVectors>(k, a, b, col, c, ldc, start, row_init, tail);
    default: return tile<1, kTileVectors>(k, a, b, col, c, ldc, start, row_init, tail);
  }
}

template <class B>
__attribute__((target("avx512f,avx512vl,fma"))) void narrow_tile_rows(
    int64_t rows, int64_t k, StridedMatrix a, const B& b, int64_t col, float* c, int64_t ldc,
    Start start, const float* row_init, __mmask8 tail) {
  switch (rows) {
    case 6: return narrow_tile<6>(k, a, b, col, c, ldc, start, row_init, tail);
    case 5: return narrow_tile<5>(k, a, b, col, c, ldc, start, row_init, tail);
    case 4: return narrow_tile<4>(k, a, b, col, c, ldc, start, row_init, tail);
    case 3: return narrow_tile<3>(k, a, b, col, c, ldc, start, row_init, tail);
    case 2: return narrow_tile<2>(k, a, b, col, c, ldc, start, row_init, tail);
    default: return narrow_tile<1>(k, a, b, col, c, ldc, start, row_init, tail);
  }
}

// c's columns go in panels of 64 (kVectors vectors, the last one narrower), each in tiles of
// kRows rows.
template <class B>
__attribute__((target("avx512f,avx512vl,fma"))) void tile_gemm_avx512(int64_t m, int64_t n,
                                                                  int64_t k, StridedMatrix a,
                                                                  const B& b, float* c,
                                                                  Start start,
                                                                  const float* row_init) {
  constexpr int64_t kPanel = kVectors * kWidth;
  const int64_t panels = (n + kPanel - 1) / kPanel;
  const int64_t row_tiles = (m + kRows - 1) / kRows;
  // Tiles are independent (each output is one sum), so outside a parallel region a large
  // product spreads them over the threads with the same results. Column panels outermost: a
  // panel of b (k x 64 floats) is reused by the consecutive row tiles of one thread.
  const auto run_tile = [&](int64_t t) {
    const int64_t col = t / row_tiles * kPanel;
    const int64_t row = t % row_tiles * kRows;
    const int64_t rows = std::min<int64_t>(kRows, m - row);
    const int64_t width = std::min(kPanel, n - col);
    const StridedMatrix at = a_rows_from(a, row);
    const float* init = row_init ? row_init + row : nullptr;
    float* ct = c + row * n + col;
    if (width <= kWidth / 2) {
      const __mmask8 tail = static_cast<__mmask8>((1u << width) - 1);
      narrow_tile_rows(rows, k, at, b, col, ct, n, start, init, tail);
      return;
    }
    const int64_t rest = width % kWidth;
    const __mmask16 tail = rest ? static_cast<__mmask16>((1u << rest) - 1) : __mmask16(0xFFFF);
    switch ((width + kWidth - 1) / kWidth) {
      case 4: tile_rows<4>(rows, k, at, b, col, ct, n, start, init, tail); break;
      case 3: tile_rows<3>(rows, k, at, b, col, ct, n, start, init, tail); break;
      case 2: tile_rows<2>(rows, k, at, b, col, ct, n, start, init, tail); break;
      default: tile_rows<1>(rows, k, at, b, col, ct, n, start, init, tail); break;
    }
  };
  // A region with an if clause that is false still costs a call into the OpenMP runtime;
  // the per-image products of a convolution, called inside one, skip it altogether.
  if (!omp_in_parallel() && m * n * k >= kParallelTileWork) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < panels * row_tiles; ++t) run_tile(t);
  } else {
    for (int64_t t = 0; t < panels * row_tiles; ++t) run_tile(t);
  }
}

// dst (cols x rows) = src^T in 8 x 8 blocks, each transposed in registers (transpose8x8);
// the ragged edges are copied one by one.
__attribute__((target("avx512f,avx512vl,fma"))) void transpose_avx(const float* src, int64_t rows,
                                                               int64_t cols, float* dst) {
  const int64_t full_rows = rows / 8 * 8, full_cols = cols / 8 * 8;
  for (int64_t r = 0; r < full_rows; r += 8) {
    for (int64_t c = 0; c < full_cols; c += 8) {
      __m256 v[8];
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) v[k] = _mm256_loadu_ps(src + (r + k) * cols + c);
      __m256 out[8];
      transpose8x8(v, out);
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) _mm256_storeu_ps(dst + (c + k) * rows + r, out[k]);
    }
    for (int64_t c = full_cols; c < cols; ++c)
      for (int64_t k = r; k < r + 8; ++k) dst[c * rows + k] = src[k * cols + c];
  }
  for (int64_t r = full_rows; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
}

#endif  // MIXPREC_TILE_GEMM_X86

}  // namespace

void transpose_f32(const float* src, int64_t rows, int64_t cols, float* dst) {
#if MIXPREC_TILE_GEMM_X86
  if (tile_gemm_vectorised()) return transpose_avx(src, rows, cols, dst);
#endif
  constexpr int64_t kBlock = 16;  // square blocks that stay in the L1 cache
  for (int64_t r0 = 0; r0 < rows; r0 += kBlock) {
    const int64_t r1 = std::min(rows, r0 + kBlock);
    for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
      const int64_t c1 = std::min(cols, c0 + kBlock);
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t r = r0; r < r1; ++r) dst[c * rows + r] = src[r * cols + c];
    }
  }
}

bool tile_gemm_vectorised() {
#if MIXPREC_TILE_GEMM_X86
  return vectorised_allowed.load(std::memory_order_relaxed) && cpu_has_avx512();
#else
  return false;
#endif
}

void set_tile_gemm_vectorised(bool allowed) { vectorised_allowed.store(allowed); }

namespace {

// The product of an m x 0 and a 0 x n matrix: c is zero (or row_init), or unchanged when
// accumulating. Handled before any pointer into a or b is formed, since an empty operand may
// be a null pointer and an offset from one is undefined.
void empty_product(int64_t m, int64_t n, float* c, bool accumulate, const float* row_init) {
  if (accumulate) return;
  for (int64_t i = 0; i < m; ++i) {
    std::fill(c + i * n, c + (i + 1) * n, row_init ? row_init[i] : 0.0f);
  }
}

}  // namespace

void tile_gemm_f32(int64_t m, int64_t n, int64_t k, StridedMatrix a, const float* b, float* c,
                   bool accumulate, const float* row_init) {
  MIXPREC_CHECK(!(accumulate && row_init),
                "tile_gemm_f32: accumulate and row_init exclude each other");
  if (m == 0 || n == 0) return;
  if (k == 0) return empty_product(m, n, c, accumulate, row_init);
#if MIXPREC_TILE_GEMM_X86
  if (tile_gemm_vectorised()) {
    const Start start =
        row_init ? Start::RowInit : accumulate ? Start::Accumulate : Start::Zero;
    return tile_gemm_avx512(m, n, k, a, DenseRows{b, n}, c, start, row_init);
  }
#endif
  MIXPREC_CHECK(a.row_offsets == nullptr,
                "tile_gemm_f32: operand a with row offsets needs AVX-512 (F and VL), which this "
                "CPU lacks");
  const bool natural = a.row_stride == k && a.col_stride == 1;
  const bool transposed = a.row_stride == 1 && a.col_stride == m;
  MIXPREC_CHECK(natural || transposed, "tile_gemm_f32: operand a with strides (", a.row_stride,
                ", ", a.col_stride, ") is neither a row-major ", m, " x ", k,
                " matrix nor the transpose of one");
  if (row_init) {
    for (int64_t i = 0; i < m; ++i) std::fill(c + i * n, c + (i + 1) * n, row_init[i]);
  }
  gemm_f32(transposed && !natural, false, m, n, k, 1.0f, a.data, b,
           row_init || accumulate ? 1.0f : 0.0f, c);
}

void tile_gemm_rows_f32(int64_t m, int64_t n, int64_t k, StridedMatrix a, const OffsetRows& b,
                        float* c, const float* row_init) {
  MIXPREC_CHECK(tile_gemm_vectorised(),
                "tile_gemm_rows_f32: needs AVX-512 (F and VL), which this CPU lacks");
  if (m == 0 || n == 0) return;
  if (k == 0) return empty_product(m, n, c, false, row_init);
#if MIXPREC_TILE_GEMM_X86
  tile_gemm_avx512(m, n, k, a, TableRows{b.base, b.offsets}, c,
                   row_init ? Start::RowInit : Start::Zero, row_init);
#endif
}

}  // namespace mixprec::cpu
