// Storage: a move-only RAII byte buffer on one device, allocated through that device's
// backend. Tensors share a Storage through a shared_ptr; a deep copy is always explicit
// (Tensor::clone()).
#pragma once

#include <cstddef>

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

 private:
  void release() noexcept;

  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
};

}  // namespace mixprec
