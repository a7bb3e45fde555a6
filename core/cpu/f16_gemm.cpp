// The FP16 packed GEMM (core/cpu/f16_gemm.h), on the tiles of core/cpu/packed_gemm.h. B is
// widened into panels of 64 FP32 columns (k x 64 each, read as four vectors per step), once
// per call. A is widened per task: the six rows of a tile, k FP32 values each, into the task
// thread's buffer, so no FP32 copy of the whole of A exists; that costs one conversion per 64
// multiply-adds, as a tile's rows are widened again for each panel. The kernel issues 24 FMAs
// per step of k, as the FP32 tile kernel (core/cpu/cpu_tile_gemm.cpp) does.
#include "core/cpu/f16_gemm.h"

#include <algorithm>

#include "core/convert.h"
#include "core/cpu/packed_gemm.h"
#include "core/cpu/transpose8x8.h"
#include "core/cpu/tile_gemm.h"
#include "core/error.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MIXPREC_F16_GEMM_X86 1
#include <immintrin.h>
#else
#define MIXPREC_F16_GEMM_X86 0
#endif

// GCC 12 reports the _mm512_undefined_*() placeholders inside its own AVX-512 intrinsics (the
// FP16 conversions) as maybe-uninitialized once inlined here (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace mixprec::cpu {
namespace {

using packed::Blend;
using packed::kPanel;
using packed::kRows;
using packed::kVectors;
constexpr int64_t kPackRows = 64;   // rows of B per packing task
constexpr int64_t kWidenRows = 16;  // rows of op(a) per widening task (one masked vector)

// What the kernels use: AVX-512 F, VL and BW, and F16C (which clang's __builtin_cpu_supports
// does not name: the converters' check, with AVX2 and FMA).
bool cpu_has_f16_kernels() {
#if MIXPREC_F16_GEMM_X86
  static const bool has = [] {
    __builtin_cpu_init();
    return detail::vector_isa_supported(detail::VectorIsa::kAvx2) &&
           __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw");
  }();
  return has;
#else
  return false;
#endif
}

// Tags of the per-thread buffers (packed::thread_buffer).
struct Panels;
struct WidenedRows;

#if MIXPREC_F16_GEMM_X86

// n FP16 values at src widened into dst (exact: every FP16 value is an FP32 one).
__attribute__((target(MIXPREC_PACKED_TARGET ",f16c"))) void widen_run(const uint16_t* src,
                                                                      float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, packed::load_widened(0xFFFF, reinterpret_cast<const half*>(src + i)));
  if (i < n) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(dst + i, mask,
                          packed::load_widened(mask, reinterpret_cast<const half*>(src + i)));
  }
}

// Rows [p0, p1) of op(b) (at most kPackRows) into the panels: element (p, j) at
// out[(j / kPanel) * k * kPanel + p * kPanel + j % kPanel], columns past n zero.
__attribute__((target(MIXPREC_PACKED_TARGET ",f16c"))) void pack_b_rows(
    bool trans_b, int64_t n, int64_t k, const uint16_t* b, int64_t panels, float* out,
    int64_t p0, int64_t p1, float* row) {  // row: room for p1 - p0 floats
  for (int64_t panel = 0; panel < panels; ++panel) {
    const int64_t j0 = panel * kPanel, cols = std::min<int64_t>(kPanel, n - j0);
    float* block = out + panel * k * kPanel;
    if (!trans_b) {
      for (int64_t p = p0; p < p1; ++p) {
        widen_run(b + p * n + j0, block + p * kPanel, cols);
        std::fill(block + p * kPanel + cols, block + (p + 1) * kPanel, 0.0f);
      }
      continue;
    }
    // b stored n x k: column j of op(b) is row j of b, widened once and spread down the panel.
    for (int64_t c = 0; c < cols; ++c) {
      widen_run(b + (j0 + c) * k + p0, row, p1 - p0);
      for (int64_t p = p0; p < p1; ++p) block[p * kPanel + c] = row[p - p0];
    }
    for (int64_t p = p0; p < p1; ++p)
      std::fill(block + p * kPanel + cols, block + (p + 1) * kPanel, 0.0f);
  }
}

// Rows [i0, i0 + rows) of op(a), rows <= 16, widened into out (row r at out + r * k).
__attribute__((target(MIXPREC_PACKED_TARGET ",f16c"))) void widen_a_rows(bool trans_a, int64_t m,
                                                                   int64_t k, const uint16_t* a,
                                                                   int64_t i0, int rows,
                                                                   float* out) {
  if (!trans_a) {
    for (int r = 0; r < rows; ++r) widen_run(a + (i0 + r) * k, out + r * k, k);
    return;
  }
  // a stored k x m: the rows are `rows` adjacent values of each of a's k rows. Eight rows by
  // eight values of p at a time are widened and transposed in registers (transpose8x8), each
  // output row then one store; the rest one value at a time.
  int r0 = 0;
  const int64_t full_p = k / 8 * 8;
  for (; r0 + 8 <= rows; r0 += 8) {
    for (int64_t p = 0; p < full_p; p += 8) {
      __m256 v[8], t[8];
#pragma GCC unroll 8
      for (int l = 0; l < 8; ++l)
        v[l] = _mm256_cvtph_ps(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + (p + l) * m + i0 + r0)));
      transpose8x8(v, t);
#pragma GCC unroll 8
      for (int l = 0; l < 8; ++l) _mm256_storeu_ps(out + (r0 + l) * k + p, t[l]);
    }
    for (int64_t p = full_p; p < k; ++p)
      for (int r = r0; r < r0 + 8; ++r) out[r * k + p] = half_bits_to_float(a[p * m + i0 + r]);
  }
  if (r0 == rows) return;
  rows -= r0;
  i0 += r0;
  out += r0 * k;
  const __mmask16 mask = static_cast<__mmask16>((1u << rows) - 1);
  for (int64_t p = 0; p < k; ++p) {
    alignas(64) float values[16];
    _mm512_store_ps(values, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, a + p * m + i0)));
    for (int r = 0; r < rows; ++r) out[r * k + p] = values[r];
  }
}

// One tile of kTileRows x kPanel sums: rows of A at `a` (stride k), the panel at `bp`, into c
// (leading dimension ldc), its first `cols` columns.
template <int kTileRows, class Out>
__attribute__((target(MIXPREC_PACKED_TARGET))) void fma_tile(int64_t k, const float* a,
                                                             const float* bp, Out* c, int64_t ldc,
                                                             int cols, Blend blend) {
  __m512 acc[kTileRows][kVectors];
  packed::zero_tile<kTileRows>(acc);
  for (int64_t p = 0; p < k; ++p) {
    __m512 bv[kVectors];
#pragma GCC unroll 4
    for (int v = 0; v < kVectors; ++v) bv[v] = _mm512_loadu_ps(bp + p * kPanel + v * 16);
#pragma GCC unroll 8
    for (int r = 0; r < kTileRows; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * k + p]);
#pragma GCC unroll 4
      for (int v = 0; v < kVectors; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
  packed::store_tile<kTileRows>(acc, c, ldc, cols, blend);
}

template <class Out>
using TileFn = void (*)(int64_t, const float*, const float*, Out*, int64_t, int, Blend);
template <class Out>
constexpr TileFn<Out> kTiles[kRows + 1] = {nullptr,          fma_tile<1, Out>, fma_tile<2, Out>,
                                           fma_tile<3, Out>, fma_tile<4, Out>, fma_tile<5, Out>,
                                           fma_tile<6, Out>};

#endif

}  // namespace

bool f16_packed_available() { return cpu_has_f16_kernels() && tile_gemm_vectorised(); }

std::string f16_products_path() {
  if (f16_packed_available()) return "widened to FP32 as packed (F16C)";
  if (!cpu_has_f16_kernels()) return "widened to FP32 once (this CPU lacks AVX-512 or F16C)";
  return "widened to FP32 once (AVX-512 kernels switched off)";
}

namespace {

template <class Out>
void packed_product(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const half* a, const half* b, float beta, Out* c) {
  MIXPREC_CHECK(f16_packed_available(), "gemm_f16_packed: this CPU lacks AVX-512 or F16C, or "
                "the path is switched off");
  if (m == 0 || n == 0) return;
#if MIXPREC_F16_GEMM_X86
  const int64_t panels = (n + kPanel - 1) / kPanel;
  const uint16_t* a16 = reinterpret_cast<const uint16_t*>(a);
  const uint16_t* b16 = reinterpret_cast<const uint16_t*>(b);
  float* const bp = packed::thread_buffer<Panels, float>(panels * k * kPanel);
  // A's rows widened once, in the packing phase like B's panels: widened per tile instead,
  // each row was converted again for every panel of B.
  float* const ap = packed::thread_buffer<WidenedRows, float>(m * k);
  const int64_t a_tasks = (m + kWidenRows - 1) / kWidenRows;
  const Blend blend{alpha, beta};
  packed::run(
      m, n, k, a_tasks + (k + kPackRows - 1) / kPackRows,
      [&](int64_t task) {
        if (task < a_tasks) {
          const int64_t i0 = task * kWidenRows;
          return widen_a_rows(trans_a, m, k, a16, i0,
                              static_cast<int>(std::min(kWidenRows, m - i0)), ap + i0 * k);
        }
        const int64_t p0 = (task - a_tasks) * kPackRows;
        float row[kPackRows];
        pack_b_rows(trans_b, n, k, b16, panels, bp, p0, std::min(k, p0 + kPackRows), row);
      },
      [&](int64_t row, int64_t col, int tile_rows, int cols) {
        kTiles<Out>[tile_rows](k, ap + row * k, bp + col / kPanel * k * kPanel,
                               c + row * n + col, n, cols, blend);
      });
#else
  (void)trans_a, (void)trans_b, (void)k, (void)alpha, (void)a, (void)b, (void)beta, (void)c;
#endif
}

}  // namespace

void gemm_f16_packed(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                     const half* a, const half* b, float beta, float* sums) {
  packed_product(trans_a, trans_b, m, n, k, alpha, a, b, beta, sums);
}

void gemm_f16_packed(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                     const half* a, const half* b, float beta, half* c) {
  packed_product(trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
}

}  // namespace mixprec::cpu
