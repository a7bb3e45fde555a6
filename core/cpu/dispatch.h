// One dispatch macro for the CPU kernels: it binds `scalar_t` to the storage type of a
// floating dtype; kernels load with to_float(), compute in float (the accumulation type) and
// store with from_float<scalar_t>(), so F16/BF16 round exactly once per output element.
// `#pragma omp` cannot appear inside a macro argument: put parallel loops in a template
// function that the dispatch lambda calls.
#pragma once

#include "core/dtype.h"
#include "core/error.h"
#include "core/half.h"

#define MIXPREC_DISPATCH_FLOATING(dtype, op_name, ...)                                   \
  [&] {                                                                                  \
    switch (dtype) {                                                                     \
      case ::mixprec::DType::F32: { using scalar_t = float; return __VA_ARGS__(); }      \
      case ::mixprec::DType::F16: { using scalar_t = ::mixprec::half; return __VA_ARGS__(); } \
      case ::mixprec::DType::BF16: { using scalar_t = ::mixprec::bfloat16; return __VA_ARGS__(); } \
      default:                                                                           \
        MIXPREC_FAIL(op_name, ": unsupported dtype ", dtype, " on the CPU backend");    \
    }                                                                                    \
  }()

#define MIXPREC_DISPATCH_ALL(dtype, op_name, ...)                                        \
  [&] {                                                                                  \
    switch (dtype) {                                                                     \
      case ::mixprec::DType::F32: { using scalar_t = float; return __VA_ARGS__(); }      \
      case ::mixprec::DType::F16: { using scalar_t = ::mixprec::half; return __VA_ARGS__(); } \
      case ::mixprec::DType::BF16: { using scalar_t = ::mixprec::bfloat16; return __VA_ARGS__(); } \
      case ::mixprec::DType::I32: { using scalar_t = int32_t; return __VA_ARGS__(); }   \
    }                                                                                    \
    MIXPREC_FAIL(op_name, ": unsupported dtype on the CPU backend");                    \
  }()

namespace mixprec {
// int32 participates in fills and casts only.
inline float to_float(int32_t v) { return static_cast<float>(v); }
}  // namespace mixprec
