#include "cuda/kernels/fill.h"

#include <type_traits>

#include "cuda/kernels/common.cuh"

namespace mixprec::kernels {
namespace {

// Grid-stride loop: one launch shape covers any n, including n beyond 2^31 elements.
__global__ void fill_f32_kernel(float* __restrict__ dst, float value, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = value;
  }
}

// Element type U (uint16_t or uint32_t) written V at a time.
template <class U, int V>
__global__ void __launch_bounds__(kThreads) fill_bits_kernel(U* dst, U bits, int64_t n) {
  using P = Pack<U, V>;
  P pack;
#pragma unroll
  for (int j = 0; j < V; ++j) pack.v[j] = bits;
  const int64_t packs = n / V;
  const int64_t stride = thread_stride();
  for (int64_t p = first_thread(); p < packs; p += stride) reinterpret_cast<P*>(dst)[p] = pack;
  for (int64_t i = packs * V + first_thread(); i < n; i += stride) dst[i] = bits;
}

template <class U>
void launch_fill_bits(U* dst, U bits, int64_t n, cudaStream_t stream) {
  if (aligned_to(dst, 16)) {
    constexpr int V = kVec<U>;
    MIXPREC_LAUNCH(grid_for((n + V - 1) / V), kThreads, stream, fill_bits_kernel<U, V>)(dst, bits,
        n);
  } else {
    MIXPREC_LAUNCH(grid_for(n), kThreads, stream, fill_bits_kernel<U, 1>)(dst, bits, n);
  }
  CUDA_CHECK_LAST();
}

// The value is formed exactly as the CPU backend forms it (double multiply-add, then the
// conversion), so integer and exactly representable steps give the same bits.
template <class T>
__global__ void __launch_bounds__(kThreads) arange_kernel(T* dst, double start, double step,
                                                         int64_t n) {
  const int64_t stride = thread_stride();
  for (int64_t i = first_thread(); i < n; i += stride) {
    const double value = start + step * static_cast<double>(i);
    if constexpr (std::is_same_v<T, int32_t>) {
      dst[i] = static_cast<int32_t>(value);
    } else {
      dst[i] = from_float<T>(static_cast<float>(value));
    }
  }
}

constexpr size_t kMaxBlocksF32 = 4096;

}  // namespace

void fill_f32(float* dst, float value, size_t n, cudaStream_t stream) {
  if (n == 0) return;  // a zero-sized grid is a launch error, not a no-op
  const size_t blocks = std::min((n + kThreads - 1) / kThreads, kMaxBlocksF32);
  MIXPREC_LAUNCH(static_cast<unsigned>(blocks), kThreads, stream, fill_f32_kernel)(dst, value, n);
  CUDA_CHECK_LAST();
}

void fill_bits(void* dst, size_t element_size, uint32_t bits, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (element_size == 2) {
    launch_fill_bits(static_cast<uint16_t*>(dst), static_cast<uint16_t>(bits), n, stream);
  } else {
    MIXPREC_CHECK(element_size == 4, "fill: elements of ", element_size,
                  " bytes are not supported; pass 2 or 4");
    launch_fill_bits(static_cast<uint32_t*>(dst), bits, n, stream);
  }
}

void arange(void* dst, DType dtype, double start, double step, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (dtype == DType::I32) {
    MIXPREC_LAUNCH(grid_for(n), kThreads, stream, arange_kernel)(static_cast<int32_t*>(dst), start,
        step, n);
    CUDA_CHECK_LAST();
    return;
  }
  MIXPREC_CUDA_DISPATCH_FLOATING(dtype, "arange", [&] {
    MIXPREC_LAUNCH(grid_for(n), kThreads, stream, arange_kernel)(static_cast<scalar_t*>(dst), start,
        step, n);
    CUDA_CHECK_LAST();
  });
}

}  // namespace mixprec::kernels
