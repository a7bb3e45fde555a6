// Layout kernels of the CUDA backend: permute, copy_narrow, the row gather that the
// embedding lookup uses, and the q/k/v heads split and merge of attention. They move whole elements without arithmetic, so they serve every
// dtype (I32 included) and are bit-exact. Internal to cuda/; pointers are device memory,
// launches are asynchronous on `stream`, and nothing is launched for empty work.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "core/math/broadcast.h"

namespace mixprec::kernels {

// y = x permuted by `plan` (core/math/broadcast.h's plan_permute of x's shape): y is
// contiguous in the plan's order. element_size: 2 or 4 bytes. At most 8 planned dims. When the
// innermost output dim is contiguous in x (attention's [B, H, T, D] to [B, T, H, D]), its runs
// move in the widest words, up to 16 bytes, that the run length, the other strides and both
// pointers allow.
void permute(const PermutePlan& plan, size_t element_size, const void* x, void* y, int64_t n,
             cudaStream_t stream);

// The word, in bytes, that permute moves `plan` in between x and y: the widest of 16, 8 and 4
// that the run of the innermost output dim (when it is contiguous in x), every other dim's x
// stride and both pointers are multiples of; element_size otherwise.
size_t permute_word_bytes(const PermutePlan& plan, size_t element_size, const void* x,
                          const void* y);

// For r < rows: copies `row_bytes` bytes from src + index(r) * src_pitch to dst + r * dst_pitch,
// where index(r) = row_ids[r] when row_ids is not null, else r. Moves the widest words (up
// to 16 bytes) that the pitches, the row length and both pointers allow.
void copy_rows(const void* src, size_t src_pitch, const int32_t* row_ids, void* dst,
               size_t dst_pitch, size_t row_bytes, int64_t rows, cudaStream_t stream);

// Backend::split_heads: qkv [batch, time, 3, heads, D] into parts[0..2] (q, k, v)
// [batch, heads, time, D], rows of row_bytes = D * element size. Moves the widest words (up to
// 16 bytes) that the row length and all four pointers allow.
void split_heads(const void* qkv, void* const (&parts)[3], int64_t batch, int64_t time,
                 int64_t heads, size_t row_bytes, cudaStream_t stream);
// Backend::merge_heads: the inverse of split_heads.
void merge_heads(const void* const (&parts)[3], void* qkv, int64_t batch, int64_t time,
                 int64_t heads, size_t row_bytes, cudaStream_t stream);

}  // namespace mixprec::kernels
