// The scatter-sum backward of the embedding lookup on the CUDA backend (the lookup itself is
// cuda/kernels/layout.h's copy_rows). Internal to cuda/; pointers are device memory and
// launches are asynchronous on `stream`.
//
// No float atomics: the positions are sorted by id with a stable radix sort (so each id keeps
// its positions in increasing order); each element (v, j) of dweight is the sum of dy[position][j]
// over v's positions in that order, in FP32 parts summed by one thread each and then added in
// part order (core/math/embedding_parts.h), rounded once. That is the CPU backend's order, so
// both backends give the same bits on every run.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/dtype.h"

namespace mixprec::kernels {

// Bytes of device scratch that embedding_backward needs for `count` ids into a [vocab, dim]
// table.
size_t embedding_backward_scratch_bytes(int64_t count, int64_t vocab, int64_t dim);

// dweight [vocab, dim] (overwritten) = for each row v, the sum of the dy rows [count, dim]
// whose id is v. ids: I32 [count] in [0, vocab). scratch: 256-byte aligned, of
// embedding_backward_scratch_bytes(count, vocab, dim) bytes.
void embedding_backward(DType dtype, const int32_t* ids, int64_t count, const void* dy,
                        void* dweight, int64_t vocab, int64_t dim, void* scratch,
                        size_t scratch_bytes, cudaStream_t stream);

}  // namespace mixprec::kernels
