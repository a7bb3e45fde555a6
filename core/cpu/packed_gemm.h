// What the CPU's packed 16-bit GEMMs share (core/cpu/bf16_dot_gemm.cpp, core/cpu/f16_gemm.cpp):
// the tile of 6 rows by a 64-column panel of B whose sums stay in 24 AVX-512 registers for
// the whole k loop, the store of a finished tile with alpha and beta into an FP32 C or,
// rounded once, a 16-bit one, and the order of work:
// first the packing tasks, then the tiles, panel-major so that consecutive tiles reuse a panel
// of B from cache; on the OpenMP threads when the product is large and no parallel region is
// active, else on the calling thread.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/convert_avx512.h"
#include "core/half.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MIXPREC_PACKED_GEMM_X86 1
#include <immintrin.h>
#else
#define MIXPREC_PACKED_GEMM_X86 0
#endif

namespace mixprec::cpu::packed {

inline constexpr int kRows = 6;    // rows of a tile
inline constexpr int kPanel = 64;  // columns of a B panel: four 16-lane vectors
inline constexpr int kVectors = kPanel / 16;
// Multiply-adds below which a product stays on the calling thread.
inline constexpr int64_t kParallelWork = int64_t{1} << 20;

struct Blend {
  float alpha, beta;
};

// The calling thread's buffer `Tag` of at least n elements, kept between calls (a fresh
// multi-megabyte allocation per product costs a page fault per 4 KiB).
template <class Tag, class T>
T* thread_buffer(int64_t n) {
  thread_local std::vector<T> buffer;
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(static_cast<size_t>(n));
  return buffer.data();
}

// pack(i) for i in [0, pack_tasks), then tile(t) for t in [0, m / kRows tiles x n / kPanel
// panels), tile t being row tile t % row_tiles of panel t / row_tiles.
template <class Pack, class Tile>
void run(int64_t m, int64_t n, int64_t k, int64_t pack_tasks, const Pack& pack,
         const Tile& tile) {
  const int64_t row_tiles = (m + kRows - 1) / kRows, panels = (n + kPanel - 1) / kPanel;
  const int64_t tasks = row_tiles * panels;
  const auto run_tile = [&](int64_t task) {
    const int64_t row = task % row_tiles * kRows, col = task / row_tiles * kPanel;
    tile(row, col, static_cast<int>(std::min<int64_t>(kRows, m - row)),
         static_cast<int>(std::min<int64_t>(kPanel, n - col)));
  };
  if (!omp_in_parallel() && m * n * std::max<int64_t>(k, 1) >= kParallelWork) {
#pragma omp parallel
    {
      // Dynamic: packing tasks of different operands differ in cost.
#pragma omp for schedule(dynamic)
      for (int64_t i = 0; i < pack_tasks; ++i) pack(i);
#pragma omp for schedule(static)
      for (int64_t task = 0; task < tasks; ++task) run_tile(task);
    }
  } else {
    for (int64_t i = 0; i < pack_tasks; ++i) pack(i);
    for (int64_t task = 0; task < tasks; ++task) run_tile(task);
  }
}

#if MIXPREC_PACKED_GEMM_X86

// A tile's sums, all zero.
template <int kTileRows>
__attribute__((target("avx512f"))) inline void zero_tile(__m512 (&acc)[kTileRows][kVectors]) {
#pragma GCC unroll 8
  for (int r = 0; r < kTileRows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < kVectors; ++v) acc[r][v] = _mm512_setzero_ps();
}

// The kernels' target: AVX-512 F for the arithmetic, BW and VL for the masked 16-bit loads
// and stores of a 16-bit C.
#define MIXPREC_PACKED_TARGET "avx512f,avx512bw,avx512vl"

// The old values of C under mask, widened, and a tile row's rounded store: FP32 as it is,
// FP16 and BF16 with the bits of the scalar conversions (core/convert_avx512.h).
__attribute__((target(MIXPREC_PACKED_TARGET))) inline __m512 load_widened(__mmask16 mask,
                                                                         const float* p) {
  return _mm512_maskz_loadu_ps(mask, p);
}
__attribute__((target(MIXPREC_PACKED_TARGET))) inline __m512 load_widened(__mmask16 mask,
                                                                         const bfloat16* p) {
  return avx512::bf16_to_f32(_mm256_maskz_loadu_epi16(mask, p));
}
__attribute__((target(MIXPREC_PACKED_TARGET))) inline __m512 load_widened(__mmask16 mask,
                                                                         const half* p) {
  return avx512::f16_to_f32(_mm256_maskz_loadu_epi16(mask, p));
}
__attribute__((target(MIXPREC_PACKED_TARGET))) inline void store_rounded(float* p, __mmask16 mask,
                                                                        __m512 v) {
  _mm512_mask_storeu_ps(p, mask, v);
}
// A whole vector takes a plain store: masked 16-bit stores are slow on some CPUs (Zen 4).
__attribute__((target(MIXPREC_PACKED_TARGET))) inline void store_16bit(void* p, __mmask16 mask,
                                                                      __m256i v) {
  if (mask == 0xFFFF) _mm256_storeu_si256(static_cast<__m256i*>(p), v);
  else _mm256_mask_storeu_epi16(p, mask, v);
}
__attribute__((target(MIXPREC_PACKED_TARGET))) inline void store_rounded(bfloat16* p,
                                                                        __mmask16 mask, __m512 v) {
  store_16bit(p, mask, avx512::f32_to_bf16(v));
}
__attribute__((target(MIXPREC_PACKED_TARGET))) inline void store_rounded(half* p, __mmask16 mask,
                                                                        __m512 v) {
  store_16bit(p, mask, avx512::f32_to_f16(v));
}

// Stores a finished tile of sums: c = alpha * acc (+ beta * c), its first `cols` columns,
// each value rounded once to Out (float, half or bfloat16).
template <int kTileRows, class Out>
__attribute__((target(MIXPREC_PACKED_TARGET))) inline void store_tile(
    const __m512 (&acc)[kTileRows][kVectors], Out* c, int64_t ldc, int cols, Blend blend) {
  const __m512 alpha = _mm512_set1_ps(blend.alpha), beta = _mm512_set1_ps(blend.beta);
#pragma GCC unroll 8
  for (int r = 0; r < kTileRows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kVectors; ++v) {
      const int left = cols - v * 16;
      if (left <= 0) break;
      const __mmask16 mask = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
      Out* out = c + r * ldc + v * 16;
      __m512 value = blend.alpha == 1.0f ? acc[r][v] : _mm512_mul_ps(alpha, acc[r][v]);
      if (blend.beta != 0.0f) value = _mm512_fmadd_ps(beta, load_widened(mask, out), value);
      store_rounded(out, mask, value);
    }
  }
}

#endif

}  // namespace mixprec::cpu::packed
