// Template members of Tensor.
#pragma once

#include <type_traits>

#include "core/error.h"
#include "core/half.h"

namespace mixprec {

template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::F32;
  else if constexpr (std::is_same_v<T, half>) return DType::F16;
  else if constexpr (std::is_same_v<T, bfloat16>) return DType::BF16;
  else {
    static_assert(std::is_same_v<T, int32_t>, "unsupported element type");
    return DType::I32;
  }
}

template <class T>
T* Tensor::data_as() {
  MIXPREC_CHECK(dtype() == dtype_of<T>(), "data_as: tensor is ", dtype(), ", asked for ",
                dtype_of<T>());
  return static_cast<T*>(data());
}

template <class T>
const T* Tensor::data_as() const {
  MIXPREC_CHECK(dtype() == dtype_of<T>(), "data_as: tensor is ", dtype(), ", asked for ",
                dtype_of<T>());
  return static_cast<const T*>(data());
}

}  // namespace mixprec
