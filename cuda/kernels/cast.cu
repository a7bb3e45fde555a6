#include "cuda/kernels/cast.h"

#include <type_traits>

#include "cuda/kernels/common.cuh"

namespace mixprec::kernels {
namespace {

template <class Src, class Dst>
__device__ __forceinline__ Dst convert(Src x) {
  if constexpr (std::is_same_v<Src, int32_t>) {
    return from_float<Dst>(static_cast<float>(x));
  } else if constexpr (std::is_same_v<Dst, int32_t>) {
    return static_cast<int32_t>(to_float(x));
  } else {
    return from_float<Dst>(to_float(x));
  }
}

// V elements per iteration, loaded and stored as packs (both sides then aligned to V
// elements of their type).
template <class Src, class Dst, int V>
__global__ void __launch_bounds__(kThreads) cast_kernel(const Src* src, Dst* dst, int64_t n) {
  const int64_t packs = n / V;
  const int64_t stride = thread_stride();
  const int64_t first = first_thread();
  for (int64_t p = first; p < packs; p += stride) {
    const Pack<Src, V> x = reinterpret_cast<const Pack<Src, V>*>(src)[p];
    Pack<Dst, V> y;
#pragma unroll
    for (int j = 0; j < V; ++j) y.v[j] = convert<Src, Dst>(x.v[j]);
    reinterpret_cast<Pack<Dst, V>*>(dst)[p] = y;
  }
  for (int64_t i = packs * V + first; i < n; i += stride) dst[i] = convert<Src, Dst>(src[i]);
}

template <class Src, class Dst>
void launch_cast(const Src* src, Dst* dst, int64_t n, cudaStream_t stream) {
  constexpr int V = 4;
  if (aligned_to(src, V * sizeof(Src)) && aligned_to(dst, V * sizeof(Dst))) {
    MIXPREC_LAUNCH(grid_for((n + V - 1) / V), kThreads, stream, cast_kernel<Src, Dst, V>)(src, dst,
        n);
  } else {
    MIXPREC_LAUNCH(grid_for(n), kThreads, stream, cast_kernel<Src, Dst, 1>)(src, dst, n);
  }
  CUDA_CHECK_LAST();
}

// Calls f(T{}) with T the storage type of any dtype, I32 included.
template <class F>
void with_storage_type(DType dtype, const F& f) {
  switch (dtype) {
    case DType::F32: return f(float{});
    case DType::F16: return f(half{});
    case DType::BF16: return f(bfloat16{});
    case DType::I32: return f(int32_t{});
  }
  MIXPREC_FAIL("cast: unknown dtype ", static_cast<int>(dtype));
}

}  // namespace

void cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n,
          cudaStream_t stream) {
  if (n <= 0) return;
  MIXPREC_CHECK(src_dtype != dst_dtype, "cast: both sides are ", src_dtype,
                "; use a copy for equal dtypes");
  with_storage_type(src_dtype, [&](auto src_tag) {
    using Src = decltype(src_tag);
    with_storage_type(dst_dtype, [&](auto dst_tag) {
      using Dst = decltype(dst_tag);
      if constexpr (!std::is_same_v<Src, Dst>) {
        launch_cast(static_cast<const Src*>(src), static_cast<Dst*>(dst), n, stream);
      }
    });
  });
}

}  // namespace mixprec::kernels
