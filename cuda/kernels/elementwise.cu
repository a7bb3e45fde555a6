#include "cuda/kernels/elementwise.h"

#include <type_traits>

#include "core/math/elementwise.h"
#include "core/op_dispatch.h"
#include "cuda/kernels/common.cuh"

namespace mixprec::kernels {
namespace {

template <UnaryOp Op>
struct UnaryFn {
  __device__ float operator()(float x) const { return unary_value<Op>(x); }
};

template <UnaryOp Op>
struct UnaryGradFn {
  __device__ float operator()(float x, float y, float dy) const { return unary_grad<Op>(x, y, dy); }
};

struct AffineFn {
  float alpha, beta;
  __device__ float operator()(float x) const { return affine_value(x, alpha, beta); }
};

struct ScaleFn {
  float scale;
  __device__ float operator()(float x) const { return scale * x; }
};

// One thread per element; the row index comes from the flat index, so any batch, row and
// column counts share one launch shape.
template <class T>
__global__ void __launch_bounds__(kThreads) causal_mask_kernel(const T* x, T* y, float fill,
                                                              int64_t n, int64_t rows,
                                                              int64_t cols) {
  const T masked = from_float<T>(fill);
  const int64_t stride = thread_stride();
  for (int64_t idx = first_thread(); idx < n; idx += stride) {
    const int64_t j = idx % cols;
    const int64_t i = idx / cols % rows;
    y[idx] = j > i ? masked : x[idx];
  }
}

}  // namespace

void unary(UnaryOp op, DType dtype, const void* x, void* y, int64_t n, cudaStream_t stream) {
  MIXPREC_CUDA_DISPATCH_FLOATING(dtype, "unary", [&] {
    with_unary_op(op, [&](auto tag) {
      constexpr UnaryOp kOp = decltype(tag)::value;
      launch_map<scalar_t, 1>({static_cast<const scalar_t*>(x)}, static_cast<scalar_t*>(y), n,
                              UnaryFn<kOp>{}, stream);
    });
  });
}

void unary_backward(UnaryOp op, DType dtype, const void* x, const void* y, const void* dy,
                    void* dx, int64_t n, cudaStream_t stream) {
  MIXPREC_CUDA_DISPATCH_FLOATING(dtype, "unary_backward", [&] {
    with_unary_op(op, [&](auto tag) {
      constexpr UnaryOp kOp = decltype(tag)::value;
      launch_map<scalar_t, 3>({static_cast<const scalar_t*>(x), static_cast<const scalar_t*>(y),
                               static_cast<const scalar_t*>(dy)},
                              static_cast<scalar_t*>(dx), n, UnaryGradFn<kOp>{}, stream);
    });
  });
}

void affine(DType dtype, const void* x, float alpha, float beta, void* y, int64_t n,
            cudaStream_t stream) {
  MIXPREC_CUDA_DISPATCH_FLOATING(dtype, "affine", [&] {
    launch_map<scalar_t, 1>({static_cast<const scalar_t*>(x)}, static_cast<scalar_t*>(y), n,
                            AffineFn{alpha, beta}, stream);
  });
}

void scale(DType dtype, const void* x, float scale, void* y, int64_t n, cudaStream_t stream) {
  MIXPREC_CUDA_DISPATCH_FLOATING(dtype, "scale", [&] {
    launch_map<scalar_t, 1>({static_cast<const scalar_t*>(x)}, static_cast<scalar_t*>(y), n,
                            ScaleFn{scale}, stream);
  });
}

void causal_mask(DType dtype, const void* x, float fill, void* y, int64_t batch, int64_t rows,
                 int64_t cols, cudaStream_t stream) {
  const int64_t n = batch * rows * cols;
  if (n <= 0) return;
  MIXPREC_CUDA_DISPATCH_FLOATING(dtype, "causal_mask", [&] {
    MIXPREC_LAUNCH(grid_for(n), kThreads, stream, causal_mask_kernel)(
        static_cast<const scalar_t*>(x), static_cast<scalar_t*>(y), fill, n, rows, cols);
    CUDA_CHECK_LAST();
  });
}

}  // namespace mixprec::kernels
