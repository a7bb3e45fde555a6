// Storage: a move-only RAII byte buffer on one device, allocated through that device's
// backend. Tensors share a Storage through a shared_ptr; a deep copy is always explicit
// (Tensor::clone()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "core/device.h"

namespace mixprec {

class Storage {
 public:
  // Allocates `nbytes` on `device` (uninitialised). nbytes == 0 is allowed (null data).
  Storage(size_t nbytes, Device device);
  ~Storage();
  Storage(Storage&& other) noexcept;
  Storage& operator=(Storage&& other) noexcept;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() { return data_; }
  const void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

  // Counts in-place writes to this buffer. Every tensor over it (handles, detach(), reshape
  // views) shares the count, so autograd can tell that a tensor saved for backward was
  // overwritten after it was saved. Backend primitives never bump it: the writers that change
  // existing data (Tensor::fill_, copy_, set, mark_modified) do, and so does a move, which
  // swaps the buffer out from under those tensors.
  uint64_t version() const { return version_; }
  void bump_version() { ++version_; }

  // The least and greatest value of an I32 buffer whose data came from the host in one copy
  // (Tensor::to sets them), so that an index check on a device need not wait to read the
  // device. Tensor::data() clears them at every writable access, so whatever writes the
  // buffer afterwards (in-place ops, backend primitives) leaves no stale bounds behind.
  struct IndexBounds {
    int32_t lowest;
    int32_t highest;
  };
  const std::optional<IndexBounds>& index_bounds() const { return index_bounds_; }
  void set_index_bounds(std::optional<IndexBounds> bounds) { index_bounds_ = bounds; }

 private:
  void release() noexcept;

  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  uint64_t version_ = 0;
  std::optional<IndexBounds> index_bounds_;
};

}  // namespace mixprec
