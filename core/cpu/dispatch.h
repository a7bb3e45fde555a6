// One dispatch macro for the CPU kernels: it binds `scalar_t` to the storage type of a
// dtype and `acc_t` to its accumulation type (float for every dtype: FP16/BF16 compute in
// FP32). Kernels load with to_float(), compute in acc_t and store with from_float<scalar_t>(),
// so F16/BF16 round exactly once per output element.
// `#pragma omp` cannot appear inside a macro argument: put parallel loops in a template
// function that the dispatch lambda calls.
#pragma once

#include "core/dtype.h"
#include "core/error.h"
#include "core/half.h"

#define MIXPREC_DISPATCH_FLOATING(dtype, op_name, ...)                                   \
  [&] {                                                                                  \
    switch (dtype) {                                                                     \
      case ::mixprec::DType::F32: { using scalar_t = float; using acc_t [[maybe_unused]] = float; return __VA_ARGS__(); }      \
      case ::mixprec::DType::F16: { using scalar_t = ::mixprec::half; using acc_t [[maybe_unused]] = float; return __VA_ARGS__(); } \
      case ::mixprec::DType::BF16: { using scalar_t = ::mixprec::bfloat16; using acc_t [[maybe_unused]] = float; return __VA_ARGS__(); } \
      default:                                                                           \
        MIXPREC_FAIL(op_name, ": unsupported dtype ", dtype, " on the CPU backend");    \
    }                                                                                    \
  }()
