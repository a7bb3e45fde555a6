// GEMM of the CPU backend. FP32 tensors are mapped straight into Eigen (no copies). 16-bit
// products sum in FP32 and round C once on store — the semantics of a tensor-core GEMM with
// FP32 accumulation: BF16 operands on the CPU's BF16 dot products where it has them
// (core/cpu/bf16_dot_gemm.h), FP16 ones widened as they are packed where the CPU has AVX-512
// and F16C (core/cpu/f16_gemm.h); elsewhere, or with those paths switched off, both are widened
// to FP32 once and multiplied by the same Eigen kernel as FP32. An F32 C for 16-bit operands
// receives the FP32 result as it is.
#include "core/cpu/cpu_gemm.h"

// GCC 12 reports Eigen's AVX-512 kernels as reading uninitialised vectors (the
// _mm512_undefined_ps placeholders inside its own intrinsics), a known false positive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <Eigen/Core>
#pragma GCC diagnostic pop

#include <algorithm>
#include <array>
#include <memory>
#include <type_traits>
#include <vector>

#include "core/backend_checks.h"
#include "core/cpu/bf16_dot_gemm.h"
#include "core/cpu/f16_gemm.h"
#include "core/cpu/blocks.h"
#include "core/cpu/common.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/tile_gemm.h"
#include "core/error.h"
#include "core/half.h"
#include "core/math/elementwise.h"
#include "core/tensor.h"

namespace mixprec {
namespace cpu {
namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMatrixMap = Eigen::Map<const RowMatrix>;

template <class OpA, class OpB, class C>
void product(const OpA& a, const OpB& b, float alpha, float beta, C& c) {
  if (beta == 0.0f) {
    // Assignment (not c *= 0) so that NaN or garbage in an uninitialised C never leaks in.
    if (alpha == 1.0f) {
      c.noalias() = a * b;
    } else {
      c.noalias() = alpha * a * b;
    }
    return;
  }
  if (beta != 1.0f) c *= beta;
  if (alpha == 1.0f) {
    c.noalias() += a * b;
  } else {
    c.noalias() += alpha * a * b;
  }
}

using StridedMap = Eigen::Map<RowMatrix, Eigen::Unaligned, Eigen::OuterStride<>>;
using ConstStridedMap = Eigen::Map<const RowMatrix, Eigen::Unaligned, Eigen::OuterStride<>>;

}  // namespace

void gemm_f32_rows(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const float* a, const float* b, float beta, float* c, int64_t first,
                   int64_t rows) {
  if (rows == 0 || n == 0) return;
  // Rows [first, first + rows) of op(a) and of c: rows of a, or columns of a stored k x m.
  StridedMap cm(c + first * n, rows, n, Eigen::OuterStride<>(n));
  if (k == 0) {
    if (beta == 0.0f) {
      cm.setZero();
    } else {
      cm *= beta;
    }
    return;
  }
  const ConstStridedMap am(trans_a ? a + first : a + first * k, trans_a ? k : rows,
                           trans_a ? rows : k, Eigen::OuterStride<>(trans_a ? m : k));
  const ConstMatrixMap bm(b, trans_b ? n : k, trans_b ? k : n);
  if (!trans_a && !trans_b) return product(am, bm, alpha, beta, cm);
  if (!trans_a && trans_b) return product(am, bm.transpose(), alpha, beta, cm);
  if (trans_a && !trans_b) return product(am.transpose(), bm, alpha, beta, cm);
  product(am.transpose(), bm.transpose(), alpha, beta, cm);
}

void gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float* a, const float* b, float beta, float* c) {
  gemm_f32_rows(trans_a, trans_b, m, n, k, alpha, a, b, beta, c, 0, m);
}

float* scratch(int slot, int64_t n) {
  struct Buffer {
    std::unique_ptr<float[]> data;
    int64_t capacity = 0;
  };
  thread_local std::array<Buffer, kScratchSlots> buffers;
  MIXPREC_CHECK(slot >= 0 && slot < kScratchSlots, "cpu scratch: no slot ", slot);
  Buffer& buffer = buffers[static_cast<size_t>(slot)];
  if (buffer.capacity < n) {
    buffer.data.reset();  // free first, so the old and new buffers never coexist
    buffer.data.reset(new float[static_cast<size_t>(n)]);
    buffer.capacity = n;
  }
  return buffer.data.get();
}

}  // namespace cpu

namespace {

// Elements of a batched operand that the descriptor touches.
int64_t span(int64_t batch, int64_t stride, int64_t matrix) {
  return (batch - 1) * stride + matrix;
}

// Calls multiply(i) for every item of the batch. Small matrices: one Eigen call each, spread
// over the batch (Eigen then stays on the calling thread). A single large matrix: Eigen
// spreads the product over the threads itself; no enclosing parallel region is opened then,
// as Eigen's threads, nested inside a one-thread team, measured slower than when started at
// the top level.
template <class Multiply>
void for_each_batch(const GemmDesc& d, const Multiply& multiply) {
  const bool parallel =
      d.batch > 1 && d.batch * d.m * d.n * std::max<int64_t>(d.k, 1) >= cpu::kParallelWork;
  if (parallel) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < d.batch; ++i) multiply(i);
  } else {
    for (int64_t i = 0; i < d.batch; ++i) multiply(i);
  }
}

// Products that the tile kernel of core/cpu/tile_gemm.h takes instead of Eigen: a single
// matrix whose B is read row by row (not transposed), with alpha 1 and beta 0 or 1, and small
// enough that the kernel, which packs nothing, keeps its operands in cache (K x 64 floats of
// B per column panel, 6 x K of A per tile): a linear layer's backward products for a batch
// of up to a thousand rows. Larger ones keep Eigen's cache blocking.
constexpr int64_t kTileMaxK = 512;
constexpr int64_t kTileMaxM = 1024;

bool tile_gemm_takes(const GemmDesc& d) {
  return d.batch == 1 && !d.trans_b && d.alpha == 1.0f && (d.beta == 0.0f || d.beta == 1.0f) &&
         d.k <= kTileMaxK && d.m <= kTileMaxM && cpu::tile_gemm_vectorised();
}

// Rows of C per task when a single product of up to kTileMaxM rows is split over the threads
// (see gemm_float). Fixed, so that each block's product, and hence every result, is the same
// whatever the thread count.
constexpr int64_t kRowBlock = 64;
// Multiply-adds below which such a product stays on the calling thread.
constexpr int64_t kSplitWork = int64_t{1} << 20;

void gemm_float(const GemmDesc& d, const float* a, const float* b, float* c) {
  if (tile_gemm_takes(d)) {
    const cpu::StridedMatrix op_a = d.trans_a ? cpu::StridedMatrix{a, 1, d.m}
                                              : cpu::StridedMatrix{a, d.k, 1};
    return cpu::tile_gemm_f32(d.m, d.n, d.k, op_a, b, c, d.beta == 1.0f);
  }
  // A single product of up to kTileMaxM rows (a linear layer's forward for a batch): blocks of
  // rows on the OpenMP threads, each an Eigen product on its thread. Eigen's own threads
  // synchronise by spinning on each other's flags, which turns a thread that the OS has
  // descheduled (a machine shared with other jobs) into a long stall of the others.
  const int64_t blocks = (d.m + kRowBlock - 1) / kRowBlock;
  if (d.batch == 1 && d.m <= kTileMaxM && blocks > 1 &&
      d.m * d.n * std::max<int64_t>(d.k, 1) >= kSplitWork) {
#pragma omp parallel for schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t first = blk * kRowBlock;
      cpu::gemm_f32_rows(d.trans_a, d.trans_b, d.m, d.n, d.k, d.alpha, a, b, d.beta, c, first,
                         std::min(kRowBlock, d.m - first));
    }
    return;
  }
  for_each_batch(d, [&](int64_t i) {
    cpu::gemm_f32(d.trans_a, d.trans_b, d.m, d.n, d.k, d.alpha, a + i * d.stride_a,
                  b + i * d.stride_b, d.beta, c + i * d.stride_c);
  });
}

// A and B of a 16-bit product in FP32, widened into scratch slots 0 and 1 (a broadcast
// operand only once for the whole batch).
struct WidenedOperands {
  const float* a;
  const float* b;
};

template <class T>
WidenedOperands widen_operands(const GemmDesc& d, const Tensor& a, const Tensor& b) {
  const int64_t span_a = span(d.batch, d.stride_a, d.m * d.k);
  const int64_t span_b = span(d.batch, d.stride_b, d.k * d.n);
  return {
      cpu::load_f32_parallel(static_cast<const T*>(a.data()), cpu::scratch(0, span_a), span_a),
      cpu::load_f32_parallel(static_cast<const T*>(b.data()), cpu::scratch(1, span_b), span_b)};
}

// F16/BF16 (T): an F32 C is gemm_float's on the widened operands; a 16-bit C block is
// computed in an FP32 buffer and rounded once on store.
template <class T>
void gemm_16bit(const GemmDesc& d, const Tensor& a, const Tensor& b, Tensor& c) {
  // Plain pointers, not a structured binding: clang 14 cannot capture one in the lambda below.
  const WidenedOperands widened = widen_operands<T>(d, a, b);
  const float* const a32 = widened.a;
  const float* const b32 = widened.b;
  if (c.dtype() == DType::F32) return gemm_float(d, a32, b32, c.data_as<float>());
  T* const c16 = static_cast<T*>(c.data());
  const int64_t mn = d.m * d.n;
  if (d.batch == 1) {
    // One product: gemm_float's choice of kernel and threads, into an FP32 C.
    float* c32 = cpu::scratch(2, mn);
    if (d.beta != 0.0f) cpu::load_f32_parallel(c16, c32, mn);
    gemm_float(d, a32, b32, c32);
    return cpu::store_f32_parallel(c32, c16, mn);
  }
  for_each_batch(d, [&](int64_t i) {
    T* ci = c16 + i * d.stride_c;
    float* c32 = cpu::scratch(2, mn);
    if (d.beta != 0.0f) cpu::load_f32_parallel(ci, c32, mn);
    cpu::gemm_f32(d.trans_a, d.trans_b, d.m, d.n, d.k, d.alpha, a32 + i * d.stride_a,
                  b32 + i * d.stride_b, d.beta, c32);
    cpu::store_f32_parallel(c32, ci, mn);
  });
}

// The 16-bit products that read their operands as they are, without widened copies: BF16 on
// the CPU's dot-product instruction (core/cpu/bf16_dot_gemm.h), FP16 widened as it is packed
// (core/cpu/f16_gemm.h). Each sums in FP32.
bool packed_16bit_available(DType dtype) {
  return dtype == DType::BF16 ? cpu::bf16_dot_available() : cpu::f16_packed_available();
}

// Out: float (the sums as they are) or T (each rounded once on store).
template <class T, class Out>
void packed_16bit_product(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                          float alpha, const T* a, const T* b, float beta, Out* c) {
  if constexpr (std::is_same_v<T, bfloat16>) {
    cpu::gemm_bf16_dot(trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
  } else {
    static_assert(std::is_same_v<T, half>, "packed_16bit_product: F16 or BF16");
    cpu::gemm_f16_packed(trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
  }
}

// A packed 16-bit product: each sum in FP32, into an F32 C as it is or into a 16-bit C
// rounded once as the kernel stores it (no FP32 copy of C).
template <class T>
void gemm_16bit_packed(const GemmDesc& d, const Tensor& a, const Tensor& b, Tensor& c) {
  const T* const a16 = static_cast<const T*>(a.data());
  const T* const b16 = static_cast<const T*>(b.data());
  const auto multiply = [&](int64_t i) {
    const T* ai = a16 + i * d.stride_a;
    const T* bi = b16 + i * d.stride_b;
    if (c.dtype() == DType::F32) {
      return packed_16bit_product(d.trans_a, d.trans_b, d.m, d.n, d.k, d.alpha, ai, bi, d.beta,
                                  c.data_as<float>() + i * d.stride_c);
    }
    packed_16bit_product(d.trans_a, d.trans_b, d.m, d.n, d.k, d.alpha, ai, bi, d.beta,
                         static_cast<T*>(c.data()) + i * d.stride_c);
  };
  if (d.batch == 1) return multiply(0);
  for_each_batch(d, multiply);
}

// The epilogue of a linear layer's product on its FP32 sums `sums` (m x n, alpha applied):
// the bias (when not null) added to every row, then the stores of GemmEpilogue. `sums` may
// be C's own memory when C is F32; it is overwritten. Row by row, so that each row's passes
// (bias, pre-GELU store, gelu, store) stay in cache.
template <class T>
void finish_epilogue(float* sums, int64_t m, int64_t n, const T* bias, T* c, T* pre_gelu) {
  std::vector<float> buffer(bias != nullptr ? static_cast<size_t>(n) : 0);
  const float* bias32 = bias != nullptr ? cpu::load_f32(bias, buffer.data(), n) : nullptr;
  const auto finish_row = [&](int64_t row) {
    float* r = sums + row * n;
    if (bias32 != nullptr)
      for (int64_t j = 0; j < n; ++j) r[j] += bias32[j];
    if (pre_gelu != nullptr) {
      cpu::store_f32(r, pre_gelu + row * n, n);
      for (int64_t j = 0; j < n; ++j) r[j] = gelu_tanh(r[j]);
    }
    cpu::store_f32(r, c + row * n, n);
  };
  if (m * n >= cpu::kParallelWorkCostly) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < m; ++i) finish_row(i);
  } else {
    for (int64_t i = 0; i < m; ++i) finish_row(i);
  }
}

template <class T>
void gemm_epilogue_typed(const GemmDesc& d, const Tensor& a, const Tensor& b, const Tensor* bias,
                         Tensor& c, Tensor* pre_gelu) {
  T* const c_data = static_cast<T*>(c.data());
  T* const pre = pre_gelu ? static_cast<T*>(pre_gelu->data()) : nullptr;
  const T* const bias_data = bias ? static_cast<const T*>(bias->data()) : nullptr;
  if constexpr (std::is_same_v<T, float>) {
    gemm_float(d, a.data_as<float>(), b.data_as<float>(), c_data);
    return finish_epilogue(c_data, d.m, d.n, bias_data, c_data, pre);
  } else {
    // The sums in FP32 (rounded nowhere), in the slot of gemm_16bit's FP32 C: the operands
    // took slots 0 and 1.
    float* sums = cpu::scratch(2, d.m * d.n);
    if (packed_16bit_available(a.dtype())) {
      packed_16bit_product(d.trans_a, d.trans_b, d.m, d.n, d.k, d.alpha,
                           static_cast<const T*>(a.data()), static_cast<const T*>(b.data()),
                           0.0f, sums);
      return finish_epilogue(sums, d.m, d.n, bias_data, c_data, pre);
    }
    const WidenedOperands widened = widen_operands<T>(d, a, b);
    gemm_float(d, widened.a, widened.b, sums);
    finish_epilogue(sums, d.m, d.n, bias_data, c_data, pre);
  }
}

}  // namespace

void CpuBackend::gemm_epilogue(const GemmDesc& desc, GemmEpilogue epilogue, const Tensor& a,
                               const Tensor& b, const Tensor* bias, Tensor& c,
                               Tensor* pre_gelu) {
  backend_checks::gemm_epilogue(kCPU, desc, epilogue, a, b, bias, c, pre_gelu);
  if (desc.m == 0 || desc.n == 0) return;
  switch (a.dtype()) {
    case DType::F32: return gemm_epilogue_typed<float>(desc, a, b, bias, c, pre_gelu);
    case DType::F16: return gemm_epilogue_typed<half>(desc, a, b, bias, c, pre_gelu);
    case DType::BF16: return gemm_epilogue_typed<bfloat16>(desc, a, b, bias, c, pre_gelu);
    default:
      MIXPREC_FAIL("gemm_epilogue: unsupported dtype ", a.dtype(), " on the CPU backend");
  }
}

void CpuBackend::gemm(const GemmDesc& desc, const Tensor& a, const Tensor& b, Tensor& c) {
  backend_checks::gemm(kCPU, desc, a, b, c);
  if (desc.batch == 0 || desc.m == 0 || desc.n == 0) return;
  switch (a.dtype()) {
    case DType::F32:
      return gemm_float(desc, a.data_as<float>(), b.data_as<float>(), c.data_as<float>());
    case DType::F16:
      if (packed_16bit_available(DType::F16)) return gemm_16bit_packed<half>(desc, a, b, c);
      return gemm_16bit<half>(desc, a, b, c);
    case DType::BF16:
      if (packed_16bit_available(DType::BF16)) return gemm_16bit_packed<bfloat16>(desc, a, b, c);
      return gemm_16bit<bfloat16>(desc, a, b, c);
    default:
      MIXPREC_FAIL("gemm: unsupported dtype ", a.dtype(), " on the CPU backend");
  }
}

}  // namespace mixprec
