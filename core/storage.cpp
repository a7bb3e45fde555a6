#include "core/storage.h"

#include <utility>

#include "core/backend.h"

namespace mixprec {

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  if (nbytes_ > 0) data_ = backend_for(device_).allocate(nbytes_);
}

Storage::~Storage() { release(); }

Storage::Storage(Storage&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      nbytes_(std::exchange(other.nbytes_, 0)),
      device_(other.device_) {}

Storage& Storage::operator=(Storage&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    nbytes_ = std::exchange(other.nbytes_, 0);
    device_ = other.device_;
  }
  return *this;
}

void Storage::release() noexcept {
  if (data_) backend_for(device_).deallocate(data_, nbytes_);
  data_ = nullptr;
  nbytes_ = 0;
}

}  // namespace mixprec
