// Force-included (first) into every kernel source of the emulated CUDA backend, which the
// host compiler builds as C++: the CUDA qualifiers, built-in variables and device intrinsics
// that the kernels use, mapped onto cuda/emulation/thread_scheduler.h. A __shared__ variable
// becomes a function-local static, one per OS thread, which every emulated thread of the
// running block shares. Only what cuda/kernels/ uses is provided, so a kernel using anything
// else fails to compile in the emulated build instead of running with invented semantics.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

// The real runtime header first: it defines the qualifiers, which are replaced below.
#include <cuda_runtime.h>

#include "core/error.h"

#include "cuda/emulation/runtime_emulation.h"
#include "cuda/emulation/thread_scheduler.h"

#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __shared__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static thread_local
#define __launch_bounds__(...)

#define threadIdx (::mixprec::emulation::position().thread_index)
#define blockIdx (::mixprec::emulation::position().block_index)
#define blockDim (::mixprec::emulation::position().block_dim)
#define gridDim (::mixprec::emulation::position().grid_dim)

inline void __syncthreads() { ::mixprec::emulation::sync_block(); }

// Full-warp shuffles only (the kernels reduce over whole warps).
template <class T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
  static_assert(std::is_trivially_copyable_v<T>, "__shfl_xor_sync: a trivially copyable value");
  if (mask != 0xFFFFFFFFu || width != 32)
    MIXPREC_FAIL("cuda emulation: __shfl_xor_sync with a partial mask or width is not emulated");
  const unsigned lane = threadIdx.x % 32u;
  T received{};
  ::mixprec::emulation::warp_exchange(&value, &received, sizeof(T),
                                      lane ^ static_cast<unsigned>(lane_mask));
  return received;
}

// One thread runs at a time, so the read-modify-write is atomic by construction.
inline unsigned long long atomicMin(unsigned long long* address, unsigned long long value) {
  const unsigned long long old = *address;
  if (value < old) *address = value;
  return old;
}

inline unsigned __float_as_uint(float x) {
  unsigned bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}

inline float __uint_as_float(unsigned bits) {
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// A single product, correctly rounded: what the intrinsic guarantees (it is never contracted
// into a fused multiply-add).
inline float __fmul_rn(float a, float b) {
  volatile float product = a * b;
  return product;
}
