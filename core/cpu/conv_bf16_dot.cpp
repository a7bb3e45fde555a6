// The BF16 dot-product filter gradient (core/cpu/conv_bf16_dot.h). Per image n, with
// K = C*KH*KW rows of the column matrix and P = OH*OW pixels,
//   dW^T (K x O) += col(x[n]) (K x P) @ dy[n]^T (P x O).
// It is summed transposed because both operands then hold their pairs along P in place: the
// column matrix is the left operand, read without packing, and dy[n] is packed as one
// 64-column panel (O = 64 in the CNNs) instead of K columns.
#include "core/cpu/conv_bf16_dot.h"

#include <cstdint>
#include <vector>

#include "core/cpu/bf16_dot_gemm.h"
#include "core/cpu/blocks.h"
#include "core/cpu/conv_columns.h"
#include "core/error.h"

namespace mixprec::cpu {
namespace {

// Per-thread buffers kept between calls (a fresh multi-megabyte allocation per image costs a
// page fault per 4 KiB).
bfloat16* column_buffer(int64_t n) {
  thread_local std::vector<uint16_t> buffer;
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(static_cast<size_t>(n));
  return reinterpret_cast<bfloat16*>(buffer.data());
}
float* sum_buffer(int64_t n) {
  thread_local std::vector<float> buffer;
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(static_cast<size_t>(n));
  return buffer.data();
}

void require_dot_products(const char* op) {
  MIXPREC_CHECK(bf16_dot_available(), op, ": this CPU has no AVX512-BF16, or the path is "
                "switched off (MIXPREC_CPU_BF16_DOT=0)");
}

}  // namespace

void conv2d_backward_filter_bf16_dot(const bfloat16* x, const bfloat16* dy, bfloat16* dw,
                                     bfloat16* dbias, const Conv2dGeometry& g) {
  require_dot_products("conv2d_backward_filter_bf16_dot");
  const int64_t k = g.rows(), pixels = g.pixels(), dy_size = g.o * pixels, w_size = g.o * k;
  const int threads = image_threads(g.n);
  std::vector<float> partial_w(static_cast<size_t>(threads * w_size), 0.0f);
  std::vector<float> partial_b(static_cast<size_t>(threads * g.o), 0.0f);
  for_each_image(g.n, threads, [&](int64_t n, int worker) {
    bfloat16* col = column_buffer(k * pixels);
    im2col(x + n * g.image(), g, col);
    const bfloat16* dyn = dy + n * dy_size;
    gemm_bf16_dot(false, true, k, g.o, pixels, 1.0f, col, dyn, 1.0f,
                  partial_w.data() + worker * w_size);
    if (dbias) {
      float* widened = sum_buffer(dy_size);
      load_f32(dyn, widened, dy_size);
      float* pb = partial_b.data() + worker * g.o;
      for (int64_t o = 0; o < g.o; ++o) pb[o] += lane_sum(widened + o * pixels, pixels);
    }
  });
  for (int t = 1; t < threads; ++t) {
    for (int64_t i = 0; i < w_size; ++i) partial_w[i] += partial_w[t * w_size + i];
    for (int64_t o = 0; o < g.o; ++o) partial_b[o] += partial_b[t * g.o + o];
  }
  std::vector<float> sum_w(static_cast<size_t>(w_size));
  for (int64_t r = 0; r < k; ++r)
    for (int64_t o = 0; o < g.o; ++o) sum_w[o * k + r] = partial_w[r * g.o + o];
  store_f32(sum_w.data(), dw, w_size);
  if (dbias) store_f32(partial_b.data(), dbias, g.o);
}

}  // namespace mixprec::cpu
