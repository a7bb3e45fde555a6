// The FP32 GEMM on raw buffers that the CPU GEMM and convolution kernels share. It lives in
// cpu_gemm.cpp, the one translation unit that compiles Eigen's product kernels.
#pragma once

#include <cstdint>

namespace mixprec::cpu {

// c = alpha * op(a) @ op(b) + beta * c, all row-major with natural leading dimensions:
// op(a) is m x k (a stored k x m when trans_a), op(b) is k x n (b stored n x k when trans_b),
// c is m x n. beta == 0 never reads c. Called from inside an OpenMP parallel region it runs
// on the calling thread; otherwise Eigen may spread one product over the OpenMP threads.
void gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float* a, const float* b, float beta, float* c);

// Rows [first, first + rows) of gemm_f32's product (same arguments, c the whole m x n
// matrix), on the calling thread when called inside a parallel region.
void gemm_f32_rows(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const float* a, const float* b, float beta, float* c, int64_t first,
                   int64_t rows);

// Per-thread FP32 work buffers that keep their memory between calls: a fresh multi-megabyte
// allocation per GEMM or convolution costs a page fault per 4 KiB. scratch(slot, n) returns
// at least n uninitialised floats, valid until the same thread asks for the same slot again;
// a buffer only grows. One kernel uses distinct slots for buffers that are live together.
inline constexpr int kScratchSlots = 4;
float* scratch(int slot, int64_t n);

}  // namespace mixprec::cpu
