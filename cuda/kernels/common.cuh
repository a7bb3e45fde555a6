// What the kernels share: launch shapes, 16-byte vector packs, the dtype dispatch and the
// elementwise map kernel. Included only by cuda/kernels/*.cu.
//
// Every kernel loads F16/BF16 with to_float(), computes in FP32 through the shared
// core/math functions and stores with from_float<T>() (core/half.h), so a value is rounded
// exactly once on store. Single-operation results (casts, products by a power of two, the
// unscale, copies) have the CPU backend's bits; formulas of several operations may differ in
// the last bit, because nvcc and the host compiler each fuse multiply-adds where they choose.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include <cuda_runtime.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/half.h"
#include "cuda/cuda_check.h"
#include "cuda/kernel_profile.h"

namespace mixprec::kernels {

inline constexpr int kThreads = 256;
inline constexpr int kWarp = 32;
// Enough blocks to keep every SM of a large GPU busy many times over; grid-stride loops
// cover the rest.
inline constexpr int64_t kMaxBlocks = int64_t{1} << 16;
// Dimensions of an index space after merging (core shapes have far fewer).
inline constexpr int kMaxDims = 8;

// 32-bit index arithmetic (much cheaper division on the GPU) whenever every offset of a walk
// over n elements fits.
inline bool fits_32_bits(int64_t n) { return n < (int64_t{1} << 31); }

// Blocks of kThreads threads for `items` work items (at least one block).
inline unsigned grid_for(int64_t items) {
  return static_cast<unsigned>(std::clamp<int64_t>((items + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

__host__ __device__ inline bool aligned_to(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// V consecutive elements moved as one aligned load or store (16 bytes when V is kVec<T>).
template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <class T>
inline constexpr int kVec = static_cast<int>(16 / sizeof(T));

// MIXPREC_LAUNCH(grid, block, stream, kernel)(arguments...); queues
// kernel<<<grid, block, 0, stream>>>(arguments...), with template arguments of the kernel
// deduced from the arguments as in a plain launch. In the emulated build (cuda/emulation/)
// the same statement runs every thread on the calling CPU thread, each with its own copy of
// the arguments, and reports an invalid configuration through cudaGetLastError(). Either way
// a ProfiledLaunch (cuda/kernel_profile.h) brackets the launch until the end of the
// statement, naming it by the kernel expression and the launching function; it must
// therefore be a statement of its own. The emulated launch's lambda captures nothing (the
// kernel expression names a kernel and compile-time arguments only, as <<<>>> requires), so
// a launch on a stream being captured into a graph can keep it for the replays.
#if defined(MIXPREC_CUDA_EMULATION)
#define MIXPREC_LAUNCH(grid, block, stream, ...)                                       \
  ::mixprec::ProfiledLaunch(#__VA_ARGS__, __PRETTY_FUNCTION__, stream, grid, block),   \
      ::mixprec::emulation::KernelLaunch(grid, block, stream, [](auto... arguments) {  \
        __VA_ARGS__(arguments...);                                                     \
      })
#else
#define MIXPREC_LAUNCH(grid, block, stream, ...)                        \
  ::mixprec::ProfiledLaunch(#__VA_ARGS__, __PRETTY_FUNCTION__, stream, grid, block), \
      __VA_ARGS__<<<grid, block, 0, stream>>>
#endif

__device__ __forceinline__ int64_t first_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ int64_t thread_stride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// The storage type of a floating dtype; the message names the primitive.
#define MIXPREC_CUDA_DISPATCH_FLOATING(dtype, op_name, ...)                               \
  [&] {                                                                                   \
    switch (dtype) {                                                                      \
      case ::mixprec::DType::F32: { using scalar_t = float; return __VA_ARGS__(); }       \
      case ::mixprec::DType::F16: { using scalar_t = ::mixprec::half; return __VA_ARGS__(); } \
      case ::mixprec::DType::BF16: { using scalar_t = ::mixprec::bfloat16; return __VA_ARGS__(); } \
      default:                                                                            \
        MIXPREC_FAIL(op_name, ": unsupported dtype ", dtype, " on the CUDA backend");    \
    }                                                                                     \
  }()

// ---- the elementwise map ------------------------------------------------------------------

template <class T, int N>
struct Inputs {
  const T* p[N];
};

template <class F, class T, int N, int V>
__device__ __forceinline__ float apply_at(const F& f, const Pack<T, V> (&x)[N], int j) {
  if constexpr (N == 1) return f(to_float(x[0].v[j]));
  else if constexpr (N == 2) return f(to_float(x[0].v[j]), to_float(x[1].v[j]));
  else {
    static_assert(N == 3, "apply_at: 1 to 3 inputs");
    return f(to_float(x[0].v[j]), to_float(x[1].v[j]), to_float(x[2].v[j]));
  }
}

// out[i] = f(in[0][i], ..., in[N-1][i]) for i < n, V elements per load (every pointer then
// aligned to V elements), the last n % V elements one at a time. Each pack is loaded before
// it is stored, so out may alias an input.
template <class T, int N, int V, class F>
__global__ void __launch_bounds__(kThreads) map_kernel(Inputs<T, N> in, T* out, int64_t n, F f) {
  using P = Pack<T, V>;
  const int64_t packs = n / V;
  const int64_t stride = thread_stride();
  const int64_t first = first_thread();
  for (int64_t p = first; p < packs; p += stride) {
    P x[N];
#pragma unroll
    for (int k = 0; k < N; ++k) x[k] = reinterpret_cast<const P*>(in.p[k])[p];
    P y;
#pragma unroll
    for (int j = 0; j < V; ++j) y.v[j] = from_float<T>(apply_at(f, x, j));
    reinterpret_cast<P*>(out)[p] = y;
  }
  for (int64_t i = packs * V + first; i < n; i += stride) {
    Pack<T, 1> x[N];
#pragma unroll
    for (int k = 0; k < N; ++k) x[k].v[0] = in.p[k][i];
    out[i] = from_float<T>(apply_at(f, x, 0));
  }
}

// Launches map_kernel with 16-byte packs when every pointer allows them.
template <class T, int N, class F>
void launch_map(const std::array<const T*, N>& in, T* out, int64_t n, const F& f,
                cudaStream_t stream) {
  if (n <= 0) return;
  Inputs<T, N> args;
  bool vector = aligned_to(out, 16);
  for (int k = 0; k < N; ++k) {
    args.p[k] = in[k];
    vector = vector && aligned_to(in[k], 16);
  }
  if (vector) {
    constexpr int V = kVec<T>;
    MIXPREC_LAUNCH(grid_for((n + V - 1) / V), kThreads, stream, map_kernel<T, N, V, F>)(args, out,
        n, f);
  } else {
    MIXPREC_LAUNCH(grid_for(n), kThreads, stream, map_kernel<T, N, 1, F>)(args, out, n, f);
  }
  CUDA_CHECK_LAST();
}

// ---- fixed-order block reduction ----------------------------------------------------------

// Sum of `value` over the kThreads threads of the block, by a shared-memory tree whose
// order depends only on the thread indices, so results are the same on every run. Every
// thread of the block must call it; the result is valid in thread 0. `scratch` holds
// kThreads floats and may be reused after the next __syncthreads().
__device__ __forceinline__ float block_sum(float value, float* scratch) {
  const int t = threadIdx.x;
  scratch[t] = value;
  __syncthreads();
#pragma unroll
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (t < width) scratch[t] += scratch[t + width];
    __syncthreads();
  }
  return scratch[0];
}

}  // namespace mixprec::kernels
