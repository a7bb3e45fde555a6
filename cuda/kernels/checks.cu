#include "cuda/kernels/checks.h"

#include "core/math/amp.h"
#include "cuda/kernels/common.cuh"

namespace mixprec::kernels {
namespace {

template <class T, int V>
__global__ void __launch_bounds__(kThreads) non_finite_kernel(const T* x, int64_t n, int32_t* flag) {
  using P = Pack<T, V>;
  const int64_t packs = n / V;
  const int64_t stride = thread_stride();
  const int64_t first = first_thread();
  bool bad = false;
  for (int64_t p = first; p < packs; p += stride) {
    const P v = reinterpret_cast<const P*>(x)[p];
#pragma unroll
    for (int j = 0; j < V; ++j) bad = bad || !is_finite_value(to_float(v.v[j]));
  }
  for (int64_t i = packs * V + first; i < n; i += stride) bad = bad || !is_finite_value(to_float(x[i]));
  // Every writer stores the same value, so the race between them is harmless.
  if (bad) *flag = 1;
}

__global__ void __launch_bounds__(kThreads) out_of_range_kernel(const int32_t* ids, int64_t n,
                                                               int64_t upper,
                                                               unsigned long long* first) {
  const int64_t stride = thread_stride();
  for (int64_t i = first_thread(); i < n; i += stride) {
    const int64_t id = ids[i];
    if (id < 0 || id >= upper) {
      atomicMin(first, static_cast<unsigned long long>(i));
      return;  // this thread's later indices are larger
    }
  }
}

}  // namespace

void flag_non_finite(const void* x, DType dtype, int64_t n, int32_t* flag, cudaStream_t stream) {
  CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int32_t), stream));
  if (n <= 0) return;
  MIXPREC_CUDA_DISPATCH_FLOATING(dtype, "all_finite", [&] {
    const scalar_t* p = static_cast<const scalar_t*>(x);
    if (aligned_to(p, 16)) {
      constexpr int V = kVec<scalar_t>;
      MIXPREC_LAUNCH(grid_for((n + V - 1) / V), kThreads, stream, non_finite_kernel<scalar_t, V>)(p,
          n, flag);
    } else {
      MIXPREC_LAUNCH(grid_for(n), kThreads, stream, non_finite_kernel<scalar_t, 1>)(p, n, flag);
    }
    CUDA_CHECK_LAST();
  });
}

void first_out_of_range(const int32_t* ids, int64_t n, int64_t upper, unsigned long long* first,
                        cudaStream_t stream) {
  // All bits set: UINT64_MAX, larger than any index.
  CUDA_CHECK(cudaMemsetAsync(first, 0xFF, sizeof(unsigned long long), stream));
  if (n <= 0) return;
  MIXPREC_LAUNCH(grid_for(n), kThreads, stream, out_of_range_kernel)(ids, n, upper, first);
  CUDA_CHECK_LAST();
}

}  // namespace mixprec::kernels
