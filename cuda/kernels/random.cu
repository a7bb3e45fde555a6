#include "cuda/kernels/random.h"

#include "cuda/kernels/common.cuh"

namespace mixprec::kernels {
namespace {

struct UniformDraw {
  float low, high;
  __device__ float operator()(uint64_t seed, uint64_t counter) const {
    return low + (high - low) * philox_uniform(seed, counter);
  }
};

struct NormalDraw {
  float mean, stddev;
  __device__ float operator()(uint64_t seed, uint64_t counter) const {
    return mean + stddev * philox_normal(seed, counter);
  }
};

// One Philox evaluation per element (it is compute-bound, so stores are not packed).
template <class T, class Draw>
__global__ void __launch_bounds__(kThreads) random_kernel(T* dst, int64_t n, PhiloxKey key,
                                                         Draw draw) {
  const int64_t stride = thread_stride();
  for (int64_t i = first_thread(); i < n; i += stride) {
    dst[i] = from_float<T>(draw(key.seed, key.offset + static_cast<uint64_t>(i)));
  }
}

template <class Draw>
void launch_random(const char* op, void* dst, DType dtype, int64_t n, PhiloxKey key, Draw draw,
                   cudaStream_t stream) {
  if (n <= 0) return;
  MIXPREC_CUDA_DISPATCH_FLOATING(dtype, op, [&] {
    MIXPREC_LAUNCH(grid_for(n), kThreads, stream, random_kernel)(static_cast<scalar_t*>(dst), n,
        key, draw);
    CUDA_CHECK_LAST();
  });
}

}  // namespace

void random_uniform(void* dst, DType dtype, int64_t n, PhiloxKey key, float low, float high,
                    cudaStream_t stream) {
  launch_random("random_uniform", dst, dtype, n, key, UniformDraw{low, high}, stream);
}

void random_normal(void* dst, DType dtype, int64_t n, PhiloxKey key, float mean, float stddev,
                   cudaStream_t stream) {
  launch_random("random_normal", dst, dtype, n, key, NormalDraw{mean, stddev}, stream);
}

}  // namespace mixprec::kernels
