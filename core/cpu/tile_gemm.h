// The FP32 GEMM of the convolution kernels (core/cpu/cpu_conv.cpp): the per-image products
// of an im2col convolution are small (tens to hundreds of rows and columns), where a
// register-tiled kernel that reads its operands in place beats Eigen's general product,
// which packs both operands on every call.
#pragma once

#include <cstdint>

namespace mixprec::cpu {

// An m x k operand read in place: element (i, p) at data[start(i) + p * col_stride], where row
// i starts at start(i) = row_offsets[i] when row_offsets is set (m entries), else at
// i * row_stride. A row-major matrix is {data, k, 1}; the transpose of a row-major k x m one
// is {data, 1, m}. Row offsets (rows anywhere in one buffer) need the AVX-512 kernel.
struct StridedMatrix {
  const float* data;
  int64_t row_stride, col_stride;
  const int64_t* row_offsets = nullptr;
};

// c = a @ b (+ c when accumulate), all FP32: a is m x k (see StridedMatrix), b row-major
// k x n, c row-major m x n. With row_init (m values, not null), row i of c starts from
// row_init[i] instead (a bias) and accumulate must be false. Each output element is one
// FP32 sum in k order, started from its initial value. Inside a parallel region it runs on
// the calling thread; outside one a large product spreads over the OpenMP threads, with the
// same results. On CPUs without AVX-512 (F and VL) it is gemm_f32 (core/cpu/cpu_gemm.h),
// whose summation order is Eigen's.
void tile_gemm_f32(int64_t m, int64_t n, int64_t k, StridedMatrix a, const float* b, float* c,
                   bool accumulate, const float* row_init = nullptr);

// A k x n operand whose rows are runs of one buffer at per-row offsets:
//   b(p, j) = base[offsets[p] + j].
// A convolution's column matrix is such an operand over a suitably padded copy of the image
// (core/cpu/cpu_conv.cpp): row (c, i, j) is plane c shifted by the tap (i, j). Every address
// base + offsets[p] + j for j in [0, 16 * ceil(n / 16)) must lie inside one allocation: vector
// loads span whole 16-lane groups (the lanes past n are read but not used).
struct OffsetRows {
  const float* base;
  const int64_t* offsets;  // k entries
};

// c = a @ b (+ row_init), as tile_gemm_f32 but with b an OffsetRows operand and c overwritten
// (or started from row_init). Needs the AVX-512 kernel (tile_gemm_vectorised()); throws
// mixprec::Error otherwise.
void tile_gemm_rows_f32(int64_t m, int64_t n, int64_t k, StridedMatrix a, const OffsetRows& b,
                        float* c, const float* row_init = nullptr);

// dst (cols x rows, row-major) = the transpose of src (rows x cols, row-major). Serial.
void transpose_f32(const float* src, int64_t rows, int64_t cols, float* dst);

// True when tile_gemm_f32 runs its AVX-512 kernel on this CPU (and it is not switched off).
bool tile_gemm_vectorised();

// Switches the AVX-512 kernel off (false) or back on, for every thread: the tests use it to
// run the portable paths (Eigen's GEMM, im2col and col2im) on a CPU that has AVX-512. Not to
// be called while a kernel runs.
void set_tile_gemm_vectorised(bool allowed);

}  // namespace mixprec::cpu
