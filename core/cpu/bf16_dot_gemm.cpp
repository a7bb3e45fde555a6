// The BF16 dot-product GEMM (core/cpu/bf16_dot_gemm.h). Both operands are read as pairs along
// k, the layout vdpbf16ps takes: a 32-bit word holds element 2p in its low half and 2p + 1 in
// its high half (zero past an odd k). B is packed into panels of 64 columns, each a k/2 x 64
// block of words read as four vectors per step; A is read in place when its rows already hold
// the pairs (not transposed, k even), else packed into such rows, one broadcast per row and
// step. The packing runs on the same threads as the tiles. The kernel keeps a tile of 6 x 64 sums in 24 registers for the
// whole k loop and issues 24 vdpbf16ps per pair of k, as the FP32 tile kernel
// (core/cpu/cpu_tile_gemm.cpp) issues 24 FMAs per k.
#include "core/cpu/bf16_dot_gemm.h"


#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/cpu/packed_gemm.h"
#include "core/cpu/transpose8x8.h"
#include "core/error.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MIXPREC_BF16_DOT_X86 1
#include <immintrin.h>
#else
#define MIXPREC_BF16_DOT_X86 0
#endif

// GCC 12 reports the _mm512_undefined_*() placeholders inside its own AVX-512 intrinsics (the
// rounding of a BF16 C) as maybe-uninitialized once inlined here (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace mixprec::cpu {
namespace {

using packed::Blend;
using packed::kPanel;
using packed::kRows;
using packed::kVectors;
constexpr int64_t kPackPairs = 16;  // pairs of B per packing task
constexpr int64_t kPackRows = 16;   // rows of A per packing task

bool allowed_by_environment() {
  const char* value = std::getenv("MIXPREC_CPU_BF16_DOT");
  return value == nullptr || std::strcmp(value, "0") != 0;
}

std::atomic<bool>& allowed() {
  static std::atomic<bool> flag{allowed_by_environment()};
  return flag;
}

bool cpu_has_bf16_dot() {
#if MIXPREC_BF16_DOT_X86
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
  }();
  return has;
#else
  return false;
#endif
}

// Tags of the per-thread packing buffers (packed::thread_buffer).
struct PackedA;
struct PackedB;

// Rows of op(a) as the kernel reads them: row i's pair p is the two elements at
// rows + i * stride + 2p.
struct PairRows {
  const uint16_t* rows;
  int64_t stride;
};

// Rows [r0, r1) of op(a) for a stored k x m, from element q0 of each row on, one element at a
// time.
void pack_a_transposed_scalar(int64_t m, int64_t k, const uint16_t* a, int64_t stride,
                              uint16_t* out, int64_t r0, int64_t r1, int64_t q0) {
  for (int64_t i = r0; i < r1; ++i)
    for (int64_t q = q0; q < k; ++q) out[i * stride + q] = a[q * m + i];
}

#if MIXPREC_BF16_DOT_X86
// Rows [i, i + 8) of op(a) for a stored k x m, pairs [p, p + 8) (each with both elements):
// the pair words of eight rows of a (two stored rows each, eight columns) are formed in
// vectors, one per pair, and that 8 x 8 block of words is transposed in registers so that
// each output row is one store.
__attribute__((target(MIXPREC_PACKED_TARGET))) void pack_a_pairs_8x8(int64_t m, const uint16_t* a,
                                                                    int64_t kp, uint32_t* out,
                                                                    int64_t i, int64_t p) {
  __m256 v[8];
#pragma GCC unroll 8
  for (int l = 0; l < 8; ++l) {
    const uint16_t* lo = a + 2 * (p + l) * m + i;
    const __m256i low = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lo)));
    const __m256i high =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lo + m)));
    v[l] = _mm256_castsi256_ps(_mm256_or_si256(low, _mm256_slli_epi32(high, 16)));
  }
  __m256 rows[8];
  transpose8x8(v, rows);
#pragma GCC unroll 8
  for (int l = 0; l < 8; ++l)
    _mm256_storeu_ps(reinterpret_cast<float*>(out + (i + l) * kp + p), rows[l]);
}
#endif

// Rows [i0, i1) of op(a), a stored k x m (trans_a) or m x k with an odd k, into `out`
// (stride 2 * kp, zero past k). A transposed a is packed in 8 x 8 blocks of pair words where
// they fit (rows of 8, pairs of 8 with both elements), the rest element by element.
void pack_a_rows(bool trans_a, int64_t m, int64_t k, const uint16_t* a, int64_t kp,
                 uint16_t* out, int64_t i0, int64_t i1) {
  const int64_t stride = 2 * kp;
  if (trans_a) {
    int64_t i = i0;
#if MIXPREC_BF16_DOT_X86
    const int64_t block_pairs = k / 2 / 8 * 8;
    uint32_t* words = reinterpret_cast<uint32_t*>(out);
    for (; i + 8 <= i1; i += 8) {
      for (int64_t p = 0; p < block_pairs; p += 8) pack_a_pairs_8x8(m, a, kp, words, i, p);
      pack_a_transposed_scalar(m, k, a, stride, out, i, i + 8, 2 * block_pairs);
    }
#endif
    pack_a_transposed_scalar(m, k, a, stride, out, i, i1, 0);
  } else {
    for (int64_t i = i0; i < i1; ++i) std::copy(a + i * k, a + (i + 1) * k, out + i * stride);
  }
  if (k % 2 != 0)
    for (int64_t i = i0; i < i1; ++i) out[i * stride + k] = 0;
}

// Pairs [p0, p1) of op(b) into the panels: word (p, j) at out[(j / kPanel) * kp * kPanel +
// p * kPanel + j % kPanel], element 2p in its low half, 2p + 1 (zero past k) in its high
// half, columns past n zero. Stored b (not transposed) gives a word from two rows' elements
// at one column, a loop the compiler vectorises; a transposed b holds each pair as one word
// of a row, so a column's pairs are read in row order.
void pack_b_pairs(bool trans_b, int64_t n, int64_t k, const uint16_t* b, int64_t kp,
                  int64_t panels, uint32_t* out, int64_t p0, int64_t p1) {
  for (int64_t panel = 0; panel < panels; ++panel) {
    const int64_t j0 = panel * kPanel, cols = std::min<int64_t>(kPanel, n - j0);
    uint32_t* block = out + panel * kp * kPanel;
    for (int64_t p = p0; p < p1; ++p) {
      uint32_t* words = block + p * kPanel;
      if (!trans_b) {
        const uint16_t* lo = b + 2 * p * n + j0;
        if (2 * p + 1 < k) {
          const uint16_t* hi = lo + n;
          for (int64_t c = 0; c < cols; ++c)
            words[c] = uint32_t{lo[c]} | (uint32_t{hi[c]} << 16);
        } else {
          for (int64_t c = 0; c < cols; ++c) words[c] = lo[c];
        }
      }
      std::fill(words + cols, words + kPanel, 0u);
    }
    if (!trans_b) continue;
    for (int64_t c = 0; c < cols; ++c) {
      const uint16_t* row = b + (j0 + c) * k;
      const int64_t whole = std::min(p1, k / 2);  // pairs with both elements inside k
      for (int64_t p = p0; p < whole; ++p) std::memcpy(block + p * kPanel + c, row + 2 * p, 4);
      for (int64_t p = std::max(p0, whole); p < p1; ++p) block[p * kPanel + c] = row[2 * p];
    }
  }
}

#if MIXPREC_BF16_DOT_X86

// The pair of BF16 values at `at` as one word (element 2p low), read without assuming
// alignment.
inline uint32_t pair_at(const uint16_t* at) {
  uint32_t word;
  std::memcpy(&word, at, sizeof word);
  return word;
}

// One tile of kTileRows x kPanel sums: the rows of A at `a`, the panel at `bp`, into c
// (leading dimension ldc), its first `cols` columns. Constant trip counts, so that the
// accumulators stay in registers.
template <int kTileRows, class Out>
__attribute__((target(MIXPREC_PACKED_TARGET ",avx512bf16"))) void dot_tile(
    int64_t kp, PairRows a, const uint32_t* bp, Out* c, int64_t ldc, int cols, Blend blend) {
  __m512 acc[kTileRows][kVectors];
  packed::zero_tile<kTileRows>(acc);
  for (int64_t p = 0; p < kp; ++p) {
    __m512bh bv[kVectors];
#pragma GCC unroll 4
    for (int v = 0; v < kVectors; ++v)
      bv[v] = (__m512bh)_mm512_loadu_si512(bp + p * kPanel + v * 16);
#pragma GCC unroll 8
    for (int r = 0; r < kTileRows; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(
          static_cast<int>(pair_at(a.rows + r * a.stride + 2 * p)));
#pragma GCC unroll 4
      for (int v = 0; v < kVectors; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
  packed::store_tile<kTileRows>(acc, c, ldc, cols, blend);
}

template <class Out>
using TileFn = void (*)(int64_t, PairRows, const uint32_t*, Out*, int64_t, int, Blend);
template <class Out>
constexpr TileFn<Out> kTiles[kRows + 1] = {nullptr,          dot_tile<1, Out>, dot_tile<2, Out>,
                                           dot_tile<3, Out>, dot_tile<4, Out>, dot_tile<5, Out>,
                                           dot_tile<6, Out>};

#endif

}  // namespace

bool bf16_dot_available() { return cpu_has_bf16_dot() && allowed().load(); }

std::string bf16_products_path() {
  if (!cpu_has_bf16_dot()) return "widened to FP32 (this CPU has no AVX512-BF16)";
  if (!allowed().load()) return "widened to FP32 (AVX512-BF16 switched off)";
  return "AVX512-BF16 dot products";
}

void set_bf16_dot_allowed(bool allowed_now) { allowed().store(allowed_now); }

namespace {

template <class Out>
void dot_product(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const bfloat16* a, const bfloat16* b, float beta, Out* c) {
  MIXPREC_CHECK(bf16_dot_available(), "gemm_bf16_dot: this CPU has no AVX512-BF16, or the path "
                "is switched off (MIXPREC_CPU_BF16_DOT=0)");
  if (m == 0 || n == 0) return;
#if MIXPREC_BF16_DOT_X86
  const int64_t kp = (k + 1) / 2;
  const int64_t panels = (n + kPanel - 1) / kPanel;
  const uint16_t* a16 = reinterpret_cast<const uint16_t*>(a);
  const uint16_t* b16 = reinterpret_cast<const uint16_t*>(b);
  // Rows of a with an even k already hold their pairs in place; others are packed.
  const bool pack_a = trans_a || k % 2 != 0;
  uint16_t* a_out = pack_a ? packed::thread_buffer<PackedA, uint16_t>(m * 2 * kp) : nullptr;
  const PairRows rows = pack_a ? PairRows{a_out, 2 * kp} : PairRows{a16, k};
  uint32_t* const bp = packed::thread_buffer<PackedB, uint32_t>(panels * kp * kPanel);
  const Blend blend{alpha, beta};
  // Packing tasks: blocks of kPackRows rows of a (when packed), then chunks of kPackPairs
  // pairs of b.
  const int64_t a_tasks = pack_a ? (m + kPackRows - 1) / kPackRows : 0;
  const int64_t b_tasks = (kp + kPackPairs - 1) / kPackPairs;
  packed::run(
      m, n, k, a_tasks + b_tasks,
      [&](int64_t i) {
        if (i < a_tasks) {
          return pack_a_rows(trans_a, m, k, a16, kp, a_out, i * kPackRows,
                             std::min(m, (i + 1) * kPackRows));
        }
        const int64_t p = (i - a_tasks) * kPackPairs;
        pack_b_pairs(trans_b, n, k, b16, kp, panels, bp, p, std::min(kp, p + kPackPairs));
      },
      [&](int64_t row, int64_t col, int tile_rows, int cols) {
        const PairRows tile_a{rows.rows + row * rows.stride, rows.stride};
        kTiles<Out>[tile_rows](kp, tile_a, bp + col / kPanel * kp * kPanel, c + row * n + col,
                               n, cols, blend);
      });
#else
  (void)trans_a, (void)trans_b, (void)k, (void)alpha, (void)a, (void)b, (void)beta, (void)c;
#endif
}

}  // namespace

void gemm_bf16_dot(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const bfloat16* a, const bfloat16* b, float beta, float* sums) {
  dot_product(trans_a, trans_b, m, n, k, alpha, a, b, beta, sums);
}

void gemm_bf16_dot(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const bfloat16* a, const bfloat16* b, float beta, bfloat16* c) {
  dot_product(trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
}

}  // namespace mixprec::cpu
