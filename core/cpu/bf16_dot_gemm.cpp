// The BF16 dot-product GEMM (core/cpu/bf16_dot_gemm.h). Both operands are packed into pairs
// along k, the layout vdpbf16ps reads: a 32-bit word holds element 2p in its low half and
// 2p + 1 in its high half (zero past an odd k). B goes into panels of 64 columns, each a
// k/2 x 64 block of words read as four vectors per step; A into rows of k/2 words, one
// broadcast per row and step. The kernel keeps a tile of 6 x 64 sums in 24 registers for the
// whole k loop and issues 24 vdpbf16ps per pair of k, as the FP32 tile kernel
// (core/cpu/cpu_tile_gemm.cpp) issues 24 FMAs per k.
#include "core/cpu/bf16_dot_gemm.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/error.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MIXPREC_BF16_DOT_X86 1
#include <immintrin.h>
#else
#define MIXPREC_BF16_DOT_X86 0
#endif

namespace mixprec::cpu {
namespace {

constexpr int kRows = 6;      // rows of a tile
constexpr int kPanel = 64;    // columns of a B panel: four 16-lane vectors
constexpr int kVectors = kPanel / 16;
// Multiply-adds below which a product stays on the calling thread.
constexpr int64_t kParallelWork = int64_t{1} << 20;

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
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
  }();
  return has;
#else
  return false;
#endif
}

// The word of elements (2p, 2p + 1) of one row or column of an operand; `at(q)` reads
// element q, and q == k (past an odd k) is zero.
template <class At>
uint32_t pair_word(int64_t p, int64_t k, const At& at) {
  const uint32_t low = at(2 * p).bits;
  const uint32_t high = 2 * p + 1 < k ? at(2 * p + 1).bits : 0u;
  return low | (high << 16);
}

// Per-thread packing buffers, kept between calls (a fresh multi-megabyte allocation per
// product costs a page fault per 4 KiB).
std::vector<uint32_t>& packed(int slot) {
  thread_local std::vector<uint32_t> buffers[2];
  return buffers[slot];
}

// op(a) as m rows of kp words.
const uint32_t* pack_a(bool trans_a, int64_t m, int64_t k, const bfloat16* a, int64_t kp) {
  std::vector<uint32_t>& out = packed(0);
  out.resize(static_cast<size_t>(m * kp));
  for (int64_t i = 0; i < m; ++i) {
    uint32_t* row = out.data() + i * kp;
    if (trans_a) {
      for (int64_t p = 0; p < kp; ++p)
        row[p] = pair_word(p, k, [&](int64_t q) { return a[q * m + i]; });
    } else {
      for (int64_t p = 0; p < kp; ++p)
        row[p] = pair_word(p, k, [&](int64_t q) { return a[i * k + q]; });
    }
  }
  return out.data();
}

// op(b) as panels of kp x kPanel words, columns past n zero.
const uint32_t* pack_b(bool trans_b, int64_t n, int64_t k, const bfloat16* b, int64_t kp,
                       int64_t panels) {
  std::vector<uint32_t>& out = packed(1);
  out.assign(static_cast<size_t>(panels * kp * kPanel), 0u);
  for (int64_t j = 0; j < n; ++j) {
    uint32_t* column = out.data() + (j / kPanel) * kp * kPanel + j % kPanel;
    if (trans_b) {
      for (int64_t p = 0; p < kp; ++p)
        column[p * kPanel] = pair_word(p, k, [&](int64_t q) { return b[j * k + q]; });
    } else {
      for (int64_t p = 0; p < kp; ++p)
        column[p * kPanel] = pair_word(p, k, [&](int64_t q) { return b[q * n + j]; });
    }
  }
  return out.data();
}

struct Blend {
  float alpha, beta;
};

#if MIXPREC_BF16_DOT_X86

// One tile of kTileRows x kPanel sums: rows of packed A at `ap` (stride kp), the panel at
// `bp`, into c (leading dimension ldc), its first `cols` columns. Constant trip counts, so
// that the accumulators stay in registers.
template <int kTileRows>
__attribute__((target("avx512f,avx512bf16"))) void dot_tile(int64_t kp, const uint32_t* ap,
                                                            const uint32_t* bp, float* c,
                                                            int64_t ldc, int cols, Blend blend) {
  __m512 acc[kTileRows][kVectors];
#pragma GCC unroll 8
  for (int r = 0; r < kTileRows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < kVectors; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kp; ++p) {
    __m512bh bv[kVectors];
#pragma GCC unroll 4
    for (int v = 0; v < kVectors; ++v)
      bv[v] = (__m512bh)_mm512_loadu_si512(bp + p * kPanel + v * 16);
#pragma GCC unroll 8
    for (int r = 0; r < kTileRows; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(ap[r * kp + p]));
#pragma GCC unroll 4
      for (int v = 0; v < kVectors; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
  const __m512 alpha = _mm512_set1_ps(blend.alpha), beta = _mm512_set1_ps(blend.beta);
#pragma GCC unroll 8
  for (int r = 0; r < kTileRows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kVectors; ++v) {
      const int left = cols - v * 16;
      if (left <= 0) break;
      const __mmask16 mask = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
      float* out = c + r * ldc + v * 16;
      __m512 value = blend.alpha == 1.0f ? acc[r][v] : _mm512_mul_ps(alpha, acc[r][v]);
      if (blend.beta != 0.0f)
        value = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(mask, out), value);
      _mm512_mask_storeu_ps(out, mask, value);
    }
  }
}

using TileFn = void (*)(int64_t, const uint32_t*, const uint32_t*, float*, int64_t, int, Blend);
constexpr TileFn kTiles[kRows + 1] = {nullptr,     dot_tile<1>, dot_tile<2>, dot_tile<3>,
                                      dot_tile<4>, dot_tile<5>, dot_tile<6>};

#endif

}  // namespace

bool bf16_dot_available() { return cpu_has_bf16_dot() && allowed().load(); }

std::string bf16_products_path() {
  if (!cpu_has_bf16_dot()) return "widened to FP32 (this CPU has no AVX512-BF16)";
  if (!allowed().load()) return "widened to FP32 (AVX512-BF16 switched off)";
  return "AVX512-BF16 dot products";
}

void set_bf16_dot_allowed(bool allowed_now) { allowed().store(allowed_now); }

void gemm_bf16_dot(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const bfloat16* a, const bfloat16* b, float beta, float* sums) {
  MIXPREC_CHECK(bf16_dot_available(), "gemm_bf16_dot: this CPU has no AVX512-BF16, or the path "
                "is switched off (MIXPREC_CPU_BF16_DOT=0)");
  if (m == 0 || n == 0) return;
#if MIXPREC_BF16_DOT_X86
  const int64_t kp = (k + 1) / 2;
  const int64_t panels = (n + kPanel - 1) / kPanel;
  const int64_t row_tiles = (m + kRows - 1) / kRows;
  const uint32_t* ap = pack_a(trans_a, m, k, a, kp);
  const uint32_t* bp = pack_b(trans_b, n, k, b, kp, panels);
  const Blend blend{alpha, beta};
  // Panel-major, so that consecutive tasks reuse a panel of B from cache.
  const auto run = [&](int64_t task) {
    const int64_t panel = task / row_tiles, tile = task % row_tiles;
    const int64_t row = tile * kRows, col = panel * kPanel;
    const int rows = static_cast<int>(std::min<int64_t>(kRows, m - row));
    const int cols = static_cast<int>(std::min<int64_t>(kPanel, n - col));
    kTiles[rows](kp, ap + row * kp, bp + panel * kp * kPanel, sums + row * n + col, n, cols,
                 blend);
  };
  const int64_t tasks = panels * row_tiles;
  if (!omp_in_parallel() && m * n * std::max<int64_t>(k, 1) >= kParallelWork) {
#pragma omp parallel for schedule(static)
    for (int64_t task = 0; task < tasks; ++task) run(task);
  } else {
    for (int64_t task = 0; task < tasks; ++task) run(task);
  }
#else
  (void)trans_a, (void)trans_b, (void)k, (void)alpha, (void)a, (void)b, (void)beta, (void)sums;
#endif
}

}  // namespace mixprec::cpu
