// cub::DeviceRadixSort::SortPairs for the emulated build (cub's own header needs nvcc): the
// same two-call protocol (a null temporary-storage pointer asks for its size) and the same
// result, a stable sort of the pairs by the key bits [begin_bit, end_bit).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <type_traits>
#include <vector>

#include <cuda_runtime_api.h>

#include "cuda/emulation/runtime_emulation.h"
#include "cuda/emulation/stream_capture.h"

namespace cub {

struct DeviceRadixSort {
  template <class Key, class Value, class NumItems>
  static cudaError_t SortPairs(void* temp_storage, size_t& temp_storage_bytes, const Key* keys_in,
                               Key* keys_out, const Value* values_in, Value* values_out,
                               NumItems num_items, int begin_bit = 0,
                               int end_bit = static_cast<int>(sizeof(Key) * 8),
                               cudaStream_t stream = nullptr) {
    static_assert(std::is_unsigned_v<Key>, "SortPairs: unsigned keys (cub orders signed and "
                                           "floating keys by their bits, not emulated)");
    if (temp_storage == nullptr) {
      temp_storage_bytes = 1;  // cub asks for some storage even for no items
      return cudaSuccess;
    }
    if (num_items < 0 || begin_bit < 0 || end_bit > static_cast<int>(sizeof(Key) * 8) ||
        begin_bit > end_bit)
      return cudaErrorInvalidValue;
    // Queued on the stream, so that a captured sort (stream_capture.h) runs at each replay.
    return mixprec::emulation::enqueue(stream, [=] {
      if (mixprec::emulation::host_only()) return;
      const auto n = static_cast<size_t>(num_items);
      const auto bits = [&](Key k) {
        const uint64_t wide = static_cast<uint64_t>(k) >> begin_bit;
        const int width = end_bit - begin_bit;
        return width >= 64 ? wide : wide & ((uint64_t{1} << width) - 1);
      };
      std::vector<size_t> order(n);
      std::iota(order.begin(), order.end(), size_t{0});
      std::stable_sort(order.begin(), order.end(),
                       [&](size_t a, size_t b) { return bits(keys_in[a]) < bits(keys_in[b]); });
      std::vector<Key> keys(n);
      std::vector<Value> values(n);
      for (size_t i = 0; i < n; ++i) {
        keys[i] = keys_in[order[i]];
        values[i] = values_in[order[i]];
      }
      std::copy(keys.begin(), keys.end(), keys_out);
      std::copy(values.begin(), values.end(), values_out);
    });
  }
};

}  // namespace cub
