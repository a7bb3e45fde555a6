// The multi-tensor table of the AMP kernels (cuda/kernels/amp_table.h), checked without a
// device: the host builder's bytes are decoded with the layout the kernels read, and every
// element of every tensor must fall in exactly one chunk. Data pointers are distinct fake
// addresses; nothing dereferences them.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "cuda/kernels/amp_table.h"

namespace {

using namespace mixprec;
using namespace mixprec::kernels;

struct DecodedTable {
  std::vector<TableEntry> entries;
  std::vector<TableChunk> chunks;
};

DecodedTable decode(const MultiTensorTable& table) {
  const size_t offset = table_chunks_offset(table.tensors);
  REQUIRE(offset % 16 == 0);
  REQUIRE(offset >= static_cast<size_t>(table.tensors) * sizeof(TableEntry));
  REQUIRE(table.bytes.size() == offset + static_cast<size_t>(table.chunks) * sizeof(TableChunk));
  DecodedTable out;
  out.entries.resize(static_cast<size_t>(table.tensors));
  out.chunks.resize(static_cast<size_t>(table.chunks));
  if (!out.entries.empty()) {
    std::memcpy(out.entries.data(), table.bytes.data(), out.entries.size() * sizeof(TableEntry));
  }
  if (!out.chunks.empty()) {
    std::memcpy(out.chunks.data(), table.bytes.data() + offset,
                out.chunks.size() * sizeof(TableChunk));
  }
  return out;
}

void* fake_address(size_t i) { return reinterpret_cast<void*>(uintptr_t{0x10000} * (i + 1)); }

}  // namespace

TEST_CASE("multi-tensor table covers every element of every tensor exactly once",
          "[cuda_plan]") {
  constexpr int64_t kChunk = kMultiTensorChunk;
  const std::vector<int64_t> sizes = {0, 1, kChunk - 1, kChunk, kChunk + 1,
                                      0, 3 * kChunk + 5, 7, 2 * kChunk, 0};
  constexpr DType kTypes[] = {DType::F32, DType::F16, DType::BF16};
  std::vector<TensorRef> refs;
  for (size_t i = 0; i < sizes.size(); ++i) {
    refs.push_back({fake_address(i), sizes[i], kTypes[i % 3]});
  }
  const MultiTensorTable table = make_multi_tensor_table("test", refs);
  REQUIRE(table.tensors == static_cast<int64_t>(sizes.size()));
  // ceil(numel / kChunk) chunks per tensor, counted by hand from `sizes`:
  // 0 + 1 + 1 + 1 + 2 + 0 + 4 + 1 + 2 + 0.
  REQUIRE(table.chunks == 12);
  const DecodedTable decoded = decode(table);

  std::vector<int> chunk_owners(decoded.chunks.size(), 0);
  for (size_t t = 0; t < sizes.size(); ++t) {
    CAPTURE(t, sizes[t]);
    const TableEntry& e = decoded.entries[t];
    CHECK(e.data == refs[t].data);
    CHECK(e.numel == sizes[t]);
    CHECK(e.dtype == static_cast<int32_t>(refs[t].dtype));
    REQUIRE(e.first_chunk >= 0);
    REQUIRE(e.chunk_count >= 0);
    REQUIRE(e.first_chunk + e.chunk_count <= table.chunks);

    std::vector<int> hits(static_cast<size_t>(sizes[t]), 0);
    for (int64_t c = e.first_chunk; c < e.first_chunk + e.chunk_count; ++c) {
      const TableChunk& chunk = decoded.chunks[static_cast<size_t>(c)];
      ++chunk_owners[static_cast<size_t>(c)];
      CHECK(chunk.tensor == static_cast<int64_t>(t));
      // A chunk starts inside its tensor and ends kMultiTensorChunk later or at its end.
      REQUIRE(chunk.begin >= 0);
      REQUIRE(chunk.begin < e.numel);
      const int64_t end = std::min(chunk.begin + kChunk, e.numel);
      for (int64_t i = chunk.begin; i < end; ++i) ++hits[static_cast<size_t>(i)];
    }
    CHECK(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
  }
  // The entries' chunk ranges partition the chunk list.
  CHECK(std::all_of(chunk_owners.begin(), chunk_owners.end(), [](int n) { return n == 1; }));
}

TEST_CASE("multi-tensor table of no tensors or only empty ones has no chunks", "[cuda_plan]") {
  const MultiTensorTable none = make_multi_tensor_table("test", {});
  CHECK(none.tensors == 0);
  CHECK(none.chunks == 0);
  CHECK(none.bytes.empty());

  const MultiTensorTable empty = make_multi_tensor_table(
      "test", {{fake_address(0), 0, DType::F32}, {fake_address(1), 0, DType::F16}});
  CHECK(empty.tensors == 2);
  CHECK(empty.chunks == 0);
  const DecodedTable decoded = decode(empty);
  for (const TableEntry& e : decoded.entries) {
    CHECK(e.numel == 0);
    CHECK(e.chunk_count == 0);
  }
}

TEST_CASE("multi-tensor table rejects a non-floating tensor", "[cuda_plan]") {
  CHECK_THROWS_AS(make_multi_tensor_table("test", {{fake_address(0), 4, DType::F32},
                                                   {fake_address(1), 4, DType::I32}}),
                  Error);
}
