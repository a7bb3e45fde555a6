// Winograd F(2x2, 3x3) convolution (core/cpu/cpu_winograd.h).
//
// The images go in groups of up to kLanes (8), one image per lane of a cpu::Floats8
// (core/cpu/simd.h): each group's input is transposed to [C][H][W][image], so that the
// transforms, which are additions and subtractions of 4x4 patches, run on whole vectors with
// no gathers and no lane shuffles. A group's tiles are then columns t * images + image of the
// 16 products U_xi [Cout x Cin] @ V_xi [Cin x columns], on the AVX-512 tile GEMM
// (core/cpu/tile_gemm.h): eight 14x14 images give 392 columns, where one image's 49 tiles
// would leave most lanes of the GEMM's 64-column panels idle. Large images go in blocks of
// tile rows, so that V and M stay near kBlockColumns columns.
//
// Each output is one FP32 expression of fixed order: its filter and input transforms, a sum
// in Cin order (the tile GEMM's, whatever the columns around it), and the output transform.
// None of it depends on how the images are grouped or on which thread runs a group, so the
// results are the same for every thread count.
#include "core/cpu/cpu_winograd.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/cpu/bf16_dot_gemm.h"
#include "core/cpu/blocks.h"
#include "core/cpu/simd.h"
#include "core/cpu/tile_gemm.h"
#include "core/error.h"

namespace mixprec::cpu {
namespace {

using backend_checks::Conv2dGeometry;

constexpr int kPoints = 16;              // Winograd coordinates xi = 4 * row + column
constexpr int64_t kGroup = kLanes;       // images per group: one per vector lane
constexpr int64_t kBlockColumns = 512;   // about this many columns per block of tile rows

// A convolution as the kernels see it: `in` source channels into `out` result channels on
// planes of h x w, in tiles of 2x2 outputs.
struct Plan {
  int64_t images, in, out, h, w;
  int64_t tile_rows, tile_cols;
  // Tile rows per block for a group of `lanes` images: about kBlockColumns columns.
  int64_t block_rows(int64_t lanes) const {
    return std::clamp<int64_t>(kBlockColumns / (lanes * tile_cols), 1, tile_rows);
  }
};

Plan make_plan(int64_t images, int64_t in, int64_t out, int64_t h, int64_t w) {
  return {images, in, out, h, w, (h + 1) / 2, (w + 1) / 2};
}

// The calling thread's buffers, kept between calls (a buffer only grows): a fresh allocation
// per group costs a page fault per 4 KiB.
struct Workspace {
  std::vector<float> filters;     // U, the calling thread only
  std::vector<float> images;      // the group's input, [in][h][w][lane]
  std::vector<float> v, m;        // a block's transformed inputs and products
  std::vector<float> results;     // a block's outputs, [out][rows][cols][lane]
  std::vector<float> transposed;  // one channel's of them, [lane][rows][cols]
  std::vector<float> group_in, group_out;  // a 16-bit group's images widened, and its results
  std::vector<bfloat16> filters16;         // U rounded to BF16, the calling thread only
  std::vector<bfloat16> v16;               // one coordinate's V rounded to BF16
};

Workspace& workspace() {
  thread_local Workspace ws;
  return ws;
}

float* at_least(std::vector<float>& buf, int64_t n) {
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(static_cast<size_t>(n));
  return buf.data();
}

// The first kUsed lanes of v to p. A group's columns are packed, kUsed (its
// image count) per tile, so the GEMM does no work for the absent images of a group of fewer
// than kLanes. The count is a template argument: a copy of a constant size is a few register
// moves, where one of a run-time size is a call.
template <int kUsed>
inline void store_lanes(float* p, const Floats8& v) {
  std::memcpy(p, &v, kUsed * sizeof(float));
}

// The distance between the V (or M) matrices of consecutive Winograd coordinates, of
// `channels` rows of `cols`: one cache line more than the matrix. A tile's transform writes
// (or reads) all 16 at once, and at a multiple of 4 KiB apart, as with 32 channels of 256
// columns, they would all fall in one set of the L1 cache (measured 4x slower).
inline int64_t coordinate_stride(int64_t channels, int64_t cols) { return channels * cols + 16; }

// What a patch reads where it lies outside the image.
alignas(32) constexpr float kZeroLanes[kLanes] = {};

// U[xi][o][c] = (G g G^T)[xi] for the 3x3 filter g of result channel o and source channel c:
//   forward:        g = w[o][c]
//   backward data:  g = rot180(w[c][o]), w read as [in][out][3][3] (the forward's [O][C])
// with G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1].
void transform_filters(const float* w, const Plan& p, bool flipped, float* u) {
  for (int64_t o = 0; o < p.out; ++o) {
    for (int64_t c = 0; c < p.in; ++c) {
      const float* src = w + (flipped ? c * p.out + o : o * p.in + c) * 9;
      float g[3][3];
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) g[i][j] = flipped ? src[(2 - i) * 3 + (2 - j)] : src[i * 3 + j];
      float gg[4][3];  // G g
      for (int j = 0; j < 3; ++j) {
        gg[0][j] = g[0][j];
        gg[1][j] = 0.5f * (g[0][j] + g[1][j] + g[2][j]);
        gg[2][j] = 0.5f * (g[0][j] - g[1][j] + g[2][j]);
        gg[3][j] = g[2][j];
      }
      for (int r = 0; r < 4; ++r) {
        const float t[4] = {gg[r][0], 0.5f * (gg[r][0] + gg[r][1] + gg[r][2]),
                            0.5f * (gg[r][0] - gg[r][1] + gg[r][2]), gg[r][2]};
        for (int j = 0; j < 4; ++j) u[((r * 4 + j) * p.out + o) * p.in + c] = t[j];
      }
    }
  }
}

// dst[(c * h + r) * w + q][lane] = src[lane][c][r][q] for the group's `lanes` images, the other
// lanes zero.
void transpose_group(const float* src, int64_t lanes, const Plan& p, float* dst) {
  const int64_t image = p.in * p.h * p.w;
  if (lanes == kLanes) return transpose_f32(src, kLanes, image, dst);
  std::fill(dst, dst + image * kLanes, 0.0f);
  for (int64_t l = 0; l < lanes; ++l)
    for (int64_t i = 0; i < image; ++i) dst[i * kLanes + l] = src[l * image + i];
}

// V[xi][c][col] for tile rows [ty0, ty0 + rows) of the group, col = t * lanes + lane with t
// the tile's number in the block: V = B^T d B, B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1].
// The cells of a patch outside the image read zeros.
template <int kUsed>
void transform_inputs(const float* images, int64_t ty0, int64_t rows,
                      const Plan& p, int64_t cols, float* v) {
  const int64_t point = coordinate_stride(p.in, cols);
  for (int64_t c = 0; c < p.in; ++c) {
    for (int64_t ty = 0; ty < rows; ++ty) {
      const float* row[4];  // the patch rows' cells, null outside the image
      for (int a = 0; a < 4; ++a) {
        const int64_t r = 2 * (ty0 + ty) - 1 + a;
        row[a] = r >= 0 && r < p.h ? images + (c * p.h + r) * p.w * kLanes : nullptr;
      }
      for (int64_t tx = 0; tx < p.tile_cols; ++tx) {
        Floats8 t[4][4];  // B^T d, a column of the patch at a time
        for (int b = 0; b < 4; ++b) {
          const int64_t q = 2 * tx - 1 + b;
          const bool inside = q >= 0 && q < p.w;
          Floats8 d[4];
          for (int a = 0; a < 4; ++a)
            load8(row[a] && inside ? row[a] + q * kLanes : kZeroLanes, d[a]);
          t[0][b] = d[0] - d[2];
          t[1][b] = d[1] + d[2];
          t[2][b] = d[2] - d[1];
          t[3][b] = d[1] - d[3];
        }
        float* out = v + c * cols + (ty * p.tile_cols + tx) * kUsed;
        for (int k = 0; k < 4; ++k) {  // (B^T d) B
          store_lanes<kUsed>(out + (4 * k + 0) * point, t[k][0] - t[k][2]);
          store_lanes<kUsed>(out + (4 * k + 1) * point, t[k][1] + t[k][2]);
          store_lanes<kUsed>(out + (4 * k + 2) * point, t[k][2] - t[k][1]);
          store_lanes<kUsed>(out + (4 * k + 3) * point, t[k][1] - t[k][3]);
        }
      }
    }
  }
}

// y = bias[o] + A^T M A for tile rows [ty0, ty0 + rows) of the group, A^T = [1 1 1 0;
// 0 1 -1 -1], into dst (the group's images, [lane][out][h][w]). The 2x2 results are
// collected by lane, [out][block rows][2 * tile_cols][lane], and transposed to image order.
// When that is the order of dst itself (a full group, the whole image in one block, even
// sides) a single transpose writes the group's output; otherwise each channel is transposed
// on its own and its rows copied out, without the outputs of a tile past an odd edge.
//
// A tile's kUsed lanes of M are read as a whole vector: in a group of fewer than kLanes images
// the other lanes hold the next tiles' values (or, past the end, the kLanes floats of slack
// that m has), which no copied output reads. A partial load would cost a store-forwarding
// stall per vector.
template <int kUsed>
void transform_outputs(const float* m, const float* bias, int64_t ty0,
                       int64_t rows, const Plan& p, int64_t cols, float* dst, Workspace& ws) {
  const int64_t width = 2 * p.tile_cols, cells = 2 * rows * width;
  float* results = at_least(ws.results, p.out * cells * kLanes);
  const int64_t point = coordinate_stride(p.out, cols);
  for (int64_t o = 0; o < p.out; ++o) {
    Floats8 b = {};
    if (bias) b += bias[o];
    float* channel = results + o * cells * kLanes;
    for (int64_t ty = 0; ty < rows; ++ty) {
      for (int64_t tx = 0; tx < p.tile_cols; ++tx) {
        const float* mt = m + o * cols + (ty * p.tile_cols + tx) * kUsed;
        Floats8 s[2][4];  // A^T M
        for (int j = 0; j < 4; ++j) {
          Floats8 a[4];
          for (int i = 0; i < 4; ++i) load8(mt + (4 * i + j) * point, a[i]);
          s[0][j] = a[0] + a[1] + a[2];
          s[1][j] = a[1] - a[2] - a[3];
        }
        float* cell = channel + (2 * ty * width + 2 * tx) * kLanes;
        const Floats8 y00 = b + (s[0][0] + s[0][1] + s[0][2]);
        const Floats8 y01 = b + (s[0][1] - s[0][2] - s[0][3]);
        const Floats8 y10 = b + (s[1][0] + s[1][1] + s[1][2]);
        const Floats8 y11 = b + (s[1][1] - s[1][2] - s[1][3]);
        std::memcpy(cell, &y00, sizeof y00);
        std::memcpy(cell + kLanes, &y01, sizeof y01);
        std::memcpy(cell + width * kLanes, &y10, sizeof y10);
        std::memcpy(cell + (width + 1) * kLanes, &y11, sizeof y11);
      }
    }
  }
  if (kUsed == kLanes && rows == p.tile_rows && 2 * rows == p.h && width == p.w) {
    transpose_f32(results, p.out * cells, kLanes, dst);
    return;
  }
  float* transposed = at_least(ws.transposed, cells * kLanes);
  const int64_t last_row = std::min(2 * (ty0 + rows), p.h);
  for (int64_t o = 0; o < p.out; ++o) {
    transpose_f32(results + o * cells * kLanes, cells, kLanes, transposed);
    for (int64_t l = 0; l < kUsed; ++l) {
      float* plane = dst + (l * p.out + o) * p.h * p.w;
      for (int64_t r = 2 * ty0; r < last_row; ++r) {
        const float* row = transposed + l * cells + (r - 2 * ty0) * width;
        std::copy(row, row + p.w, plane + r * p.w);
      }
    }
  }
}

// The 16 products M[xi] = U[xi] @ V[xi] of a block: on the FP32 tile GEMM, or with u16 (U
// rounded to BF16) not null on the BF16 dot products, each V[xi] rounded to BF16 first.
void multiply_points(const Plan& p, const float* u, const bfloat16* u16, const float* v,
                     int64_t cols, float* m, Workspace& ws) {
  const int64_t v_point = coordinate_stride(p.in, cols);
  const int64_t m_point = coordinate_stride(p.out, cols);
  if (u16 == nullptr) {
    for (int xi = 0; xi < kPoints; ++xi) {
      tile_gemm_f32(p.out, cols, p.in, {u + xi * p.out * p.in, p.in, 1}, v + xi * v_point,
                    m + xi * m_point, false);
    }
    return;
  }
  if (static_cast<int64_t>(ws.v16.size()) < p.in * cols)
    ws.v16.resize(static_cast<size_t>(p.in * cols));
  for (int xi = 0; xi < kPoints; ++xi) {
    store_f32(v + xi * v_point, ws.v16.data(), p.in * cols);
    gemm_bf16_dot(false, false, p.out, cols, p.in, 1.0f, u16 + xi * p.out * p.in,
                  ws.v16.data(), 0.0f, m + xi * m_point);
  }
}

// The convolution of kUsed (1 .. kLanes) images from src (p.in planes each) into dst (p.out
// planes each), on the calling thread unless the products are large enough for the tile GEMM
// to spread them (outside a parallel region). u16: see multiply_points.
template <int kUsed>
void run_group(const float* src, const Plan& p, const float* u, const bfloat16* u16,
               const float* bias, float* dst) {
  Workspace& ws = workspace();
  float* images = at_least(ws.images, p.in * p.h * p.w * kLanes);
  transpose_group(src, kUsed, p, images);
  const int64_t block_rows = p.block_rows(kUsed);
  for (int64_t ty0 = 0; ty0 < p.tile_rows; ty0 += block_rows) {
    const int64_t rows = std::min(block_rows, p.tile_rows - ty0);
    const int64_t cols = rows * p.tile_cols * kUsed;
    float* v = at_least(ws.v, kPoints * coordinate_stride(p.in, cols));
    // see transform_outputs for the slack
    float* m = at_least(ws.m, kPoints * coordinate_stride(p.out, cols) + kLanes);
    transform_inputs<kUsed>(images, ty0, rows, p, cols, v);
    multiply_points(p, u, u16, v, cols, m, ws);
    transform_outputs<kUsed>(m, bias, ty0, rows, p, cols, dst, ws);
  }
}

void run_group(const float* src, int64_t lanes, const Plan& p, const float* u,
               const bfloat16* u16, const float* bias, float* dst) {
  switch (lanes) {
    case 8: return run_group<8>(src, p, u, u16, bias, dst);
    case 7: return run_group<7>(src, p, u, u16, bias, dst);
    case 6: return run_group<6>(src, p, u, u16, bias, dst);
    case 5: return run_group<5>(src, p, u, u16, bias, dst);
    case 4: return run_group<4>(src, p, u, u16, bias, dst);
    case 3: return run_group<3>(src, p, u, u16, bias, dst);
    case 2: return run_group<2>(src, p, u, u16, bias, dst);
    default: return run_group<1>(src, p, u, u16, bias, dst);
  }
}

void check_applies(const Conv2dGeometry& g, const char* op) {
  MIXPREC_CHECK(winograd_applies(g), op, ": needs a 3x3 stride-1 pad-1 convolution of at least ",
                kWinogradMinChannels, " input and output channels and the AVX-512 tile GEMM, got "
                "kernel ", g.kh, "x", g.kw, ", stride (", g.sh, ",", g.sw, "), padding (", g.ph,
                ",", g.pw, "), ", g.c, " -> ", g.o, " channels");
}

// 16-bit images are widened one group at a time into the thread's workspace, and the group's
// results rounded from it: conversions of a few hundred KiB that stay in cache, where whole
// FP32 copies of the batch's input and output would cross memory twice more.
template <class T>
void run(const T* src, const float* w, const float* bias, T* dst, const Plan& p, bool flipped) {
  if (p.images == 0 || p.h == 0 || p.w == 0) return;
  Workspace& caller = workspace();
  float* u = at_least(caller.filters, kPoints * p.out * p.in);
  transform_filters(w, p, flipped, u);
  // BF16 products on the CPU's dot-product instruction take U and V rounded to BF16.
  const bfloat16* u16 = nullptr;
  if constexpr (std::is_same_v<T, bfloat16>) {
    if (bf16_dot_available()) {
      caller.filters16.resize(static_cast<size_t>(kPoints * p.out * p.in));
      store_f32(u, caller.filters16.data(), kPoints * p.out * p.in);
      u16 = caller.filters16.data();
    }
  }
  const int64_t groups = (p.images + kGroup - 1) / kGroup;
  const int64_t src_image = p.in * p.h * p.w, dst_image = p.out * p.h * p.w;
  const auto group = [&](int64_t gi) {
    const int64_t first = gi * kGroup, lanes = std::min(kGroup, p.images - first);
    if constexpr (std::is_same_v<T, float>) {
      run_group(src + first * src_image, lanes, p, u, u16, bias, dst + first * dst_image);
    } else {
      Workspace& ws = workspace();
      float* in = at_least(ws.group_in, lanes * src_image);
      float* out = at_least(ws.group_out, lanes * dst_image);
      load_f32(src + first * src_image, in, lanes * src_image);
      run_group(in, lanes, p, u, u16, bias, out);
      store_f32(out, dst + first * dst_image, lanes * dst_image);
    }
  };
  // Inside a parallel region that may not nest another active one a team would have one
  // thread: run there. A single group leaves the threads to the tile GEMM.
  const int available =
      omp_get_active_level() >= omp_get_max_active_levels() ? 1 : omp_get_max_threads();
  const int threads = static_cast<int>(std::min<int64_t>(available, groups));
  if (threads > 1) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t gi = 0; gi < groups; ++gi) group(gi);
  } else {
    for (int64_t gi = 0; gi < groups; ++gi) group(gi);
  }
}

}  // namespace

bool winograd_applies(const Conv2dGeometry& g) {
  return g.kh == 3 && g.kw == 3 && g.sh == 1 && g.sw == 1 && g.ph == 1 && g.pw == 1 &&
         g.oh == g.h && g.ow == g.w && g.c >= kWinogradMinChannels &&
         g.o >= kWinogradMinChannels && tile_gemm_vectorised();
}

template <class T>
void winograd_conv2d(const T* x, const float* w, const float* bias, T* y,
                     const Conv2dGeometry& g) {
  check_applies(g, "winograd_conv2d");
  run(x, w, bias, y, make_plan(g.n, g.c, g.o, g.h, g.w), false);
}

template <class T>
void winograd_conv2d_backward_data(const T* dy, const float* w, T* dx, const Conv2dGeometry& g) {
  check_applies(g, "winograd_conv2d_backward_data");
  run(dy, w, nullptr, dx, make_plan(g.n, g.o, g.c, g.h, g.w), true);
}

#define MIXPREC_WINOGRAD_FOR(T)                                                          \
  template void winograd_conv2d<T>(const T*, const float*, const float*, T*,            \
                                   const Conv2dGeometry&);                              \
  template void winograd_conv2d_backward_data<T>(const T*, const float*, T*,            \
                                                 const Conv2dGeometry&);
MIXPREC_WINOGRAD_FOR(float)
MIXPREC_WINOGRAD_FOR(half)
MIXPREC_WINOGRAD_FOR(bfloat16)
#undef MIXPREC_WINOGRAD_FOR

}  // namespace mixprec::cpu
