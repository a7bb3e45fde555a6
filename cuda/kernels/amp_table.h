// The multi-tensor table (MultiTensorTable::bytes): written on the host by
// make_multi_tensor_table, read on the device by the multi-tensor kernels. Free of CUDA
// headers so that the table can be checked on a machine without a device.
//
// Layout: table.tensors TableEntry, then, from the first 16-byte boundary after them
// (table_chunks_offset), table.chunks TableChunk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace mixprec::kernels {

struct TensorRef {
  void* data = nullptr;  // device memory
  int64_t numel = 0;
  DType dtype = DType::F32;  // F32, F16 or BF16
};

struct MultiTensorTable {
  std::vector<unsigned char> bytes;  // to be copied to the device as they are
  int64_t tensors = 0;
  int64_t chunks = 0;  // 0 when every tensor is empty: then nothing is launched
};

// Elements per chunk; a chunk's partial sum of squares covers exactly this many (fewer at a
// tensor's end), so the summation order is fixed by the shapes.
inline constexpr int64_t kMultiTensorChunk = int64_t{1} << 16;

// Throws mixprec::Error for a non-floating tensor (naming `op`).
MultiTensorTable make_multi_tensor_table(const char* op, const std::vector<TensorRef>& tensors);

// One per tensor, in the order given; its chunks are first_chunk ..
// first_chunk + chunk_count - 1 (none for an empty tensor).
struct TableEntry {
  void* data;
  int64_t numel;
  int64_t first_chunk;
  int32_t chunk_count;
  int32_t dtype;  // a DType value
};

// Elements [begin, min(begin + kMultiTensorChunk, numel)) of tensor `tensor`.
struct TableChunk {
  int64_t tensor;
  int64_t begin;
};

inline size_t table_chunks_offset(int64_t tensors) {
  return (static_cast<size_t>(tensors) * sizeof(TableEntry) + 15) / 16 * 16;
}

// widen_gradients' destination for table entry t (its source): F32 of the same numel,
// overwritten or, when accumulate is non-zero, added to. The targets follow the table's bytes
// from the first 16-byte boundary after them (widen_targets_offset).
struct WidenTarget {
  float* data;
  int64_t accumulate;
};

inline size_t widen_targets_offset(const MultiTensorTable& table) {
  return (table.bytes.size() + 15) / 16 * 16;
}

}  // namespace mixprec::kernels
