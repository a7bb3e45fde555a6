#include "cuda/kernels/amp_table.h"

#include <cstring>

#include "core/error.h"

namespace mixprec::kernels {

MultiTensorTable make_multi_tensor_table(const char* op, const std::vector<TensorRef>& tensors) {
  MultiTensorTable table;
  table.tensors = static_cast<int64_t>(tensors.size());
  std::vector<TableEntry> entries;
  std::vector<TableChunk> chunks;
  entries.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorRef& t = tensors[i];
    MIXPREC_CHECK(is_floating(t.dtype), op, ": tensor ", i, " is ", t.dtype,
                  "; only F32, F16 and BF16 tensors are supported");
    const int64_t count = (t.numel + kMultiTensorChunk - 1) / kMultiTensorChunk;
    entries.push_back({t.data, t.numel, static_cast<int64_t>(chunks.size()),
                       static_cast<int32_t>(count), static_cast<int32_t>(t.dtype)});
    for (int64_t c = 0; c < count; ++c) {
      chunks.push_back({static_cast<int64_t>(i), c * kMultiTensorChunk});
    }
  }
  table.chunks = static_cast<int64_t>(chunks.size());
  const size_t offset = table_chunks_offset(table.tensors);
  table.bytes.assign(offset + chunks.size() * sizeof(TableChunk), 0);
  if (!entries.empty()) {
    std::memcpy(table.bytes.data(), entries.data(), entries.size() * sizeof(TableEntry));
  }
  if (!chunks.empty()) {
    std::memcpy(table.bytes.data() + offset, chunks.data(), chunks.size() * sizeof(TableChunk));
  }
  return table;
}

}  // namespace mixprec::kernels
