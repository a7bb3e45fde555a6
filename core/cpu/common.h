// What the CPU kernels share besides index arithmetic (strided.h) and FP32 block conversion
// (blocks.h): when a loop goes parallel. Argument validation is core/backend_checks.h's.
#pragma once

#include <cstdint>

namespace mixprec::cpu {

// Below this much work (elements touched, or multiply-adds) an OpenMP loop stays serial:
// waking the team would cost more than the threads save.
inline constexpr int64_t kParallelWork = int64_t{1} << 15;
// Loops whose per-element work is a single store, conversion or test are memory-bound and
// break even only at twice the size; a Philox draw per element breaks even at half of it.
inline constexpr int64_t kParallelWorkCheap = kParallelWork * 2;
inline constexpr int64_t kParallelWorkCostly = kParallelWork / 2;

}  // namespace mixprec::cpu
