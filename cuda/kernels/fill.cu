#include "cuda/kernels/fill.h"

#include <algorithm>

#include "cuda/cuda_check.h"

namespace mixprec::kernels {
namespace {

// Grid-stride loop: one launch shape covers any n, including n beyond 2^31 elements.
__global__ void fill_f32_kernel(float* __restrict__ dst, float value, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = value;
  }
}

constexpr unsigned kBlockSize = 256;
// Enough blocks to fill every SM of a large GPU many times over; more only adds scheduling.
constexpr size_t kMaxBlocks = 4096;

}  // namespace

void fill_f32(float* dst, float value, size_t n, cudaStream_t stream) {
  if (n == 0) return;  // a zero-sized grid is a launch error, not a no-op
  const size_t blocks = std::min((n + kBlockSize - 1) / kBlockSize, kMaxBlocks);
  fill_f32_kernel<<<static_cast<unsigned>(blocks), kBlockSize, 0, stream>>>(dst, value, n);
  CUDA_CHECK_LAST();
}

}  // namespace mixprec::kernels
