#include "core/storage.h"

#include <algorithm>
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
      device_(other.device_),
      version_(other.version_),
      index_bounds_(std::exchange(other.index_bounds_, std::nullopt)) {
  other.bump_version();  // its tensors lost their data
}

Storage& Storage::operator=(Storage&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    nbytes_ = std::exchange(other.nbytes_, 0);
    device_ = other.device_;
    // Both buffers changed under any tensor saved over them.
    version_ = std::max(version_, other.version_) + 1;
    index_bounds_ = std::exchange(other.index_bounds_, std::nullopt);
    other.bump_version();
  }
  return *this;
}

void Storage::release() noexcept {
  if (data_) backend_for(device_).deallocate(data_, nbytes_);
  data_ = nullptr;
  nbytes_ = 0;
}

}  // namespace mixprec
