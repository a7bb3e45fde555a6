// What the CPU kernels share besides index arithmetic (strided.h) and FP32 block conversion
// (blocks.h): when a loop goes parallel, and the dtype check of a primitive's operands.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "core/error.h"
#include "core/tensor.h"

namespace mixprec::cpu {

// Below this much work (elements touched, or multiply-adds) an OpenMP loop stays serial:
// waking the team would cost more than the threads save.
inline constexpr int64_t kParallelWork = int64_t{1} << 15;
// Loops whose per-element work is a single store, conversion or test are memory-bound and
// break even only at twice the size; a Philox draw per element breaks even at half of it.
inline constexpr int64_t kParallelWorkCheap = kParallelWork * 2;
inline constexpr int64_t kParallelWorkCostly = kParallelWork / 2;

// Every tensor of `ts` (null entries skipped) has the dtype of the first; the message names
// `op` and the first mismatching pair.
inline void check_same_dtype(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = *ts.begin();
  for (const Tensor* t : ts) {
    if (t == nullptr) continue;
    MIXPREC_CHECK(t->dtype() == first->dtype(), op, ": dtype mismatch between ",
                  describe(*first), " and ", describe(*t));
  }
}

}  // namespace mixprec::cpu
