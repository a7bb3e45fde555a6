// Broadcasting maps and broadcast-reductions of the CUDA backend (binary, expand, sum_to).
// Internal to cuda/. Pointers are device memory of contiguous row-major tensors of one
// floating dtype; launches are asynchronous on `stream`. Shapes are validated by the caller
// (each input broadcasts to the output, right-aligned).
//
// Shapes are planned once per call on the host, as on the CPU: extent-1 output dims are
// dropped and adjacent dims that every operand walks in step are merged, so a bias over the
// last dims or a [N, 1] column becomes a two-dim walk. At most 8 dims may remain.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "core/dtype.h"
#include "core/op_kinds.h"
#include "core/shape.h"

namespace mixprec::kernels {

// out = a (op) b broadcast to out's shape. A one-element operand facing a full-size one is
// read on the device by every thread (a loss scale never travels to the host).
void binary(BinaryOp op, DType dtype, const void* a, const Shape& a_shape, const void* b,
            const Shape& b_shape, void* out, const Shape& out_shape, cudaStream_t stream);

// y = scale * x broadcast to y's shape.
void expand(DType dtype, const void* x, const Shape& x_shape, void* y, const Shape& y_shape,
            float scale, cudaStream_t stream);

// How sum_to reduces x's shape to y's. The reduction is split over a number of blocks fixed
// by the shapes alone; each split's FP32 partial sum goes to a scratch buffer, and the
// partials are added in split order, so results are the same on every run.
struct SumToPlan {
  int64_t x_numel = 0;
  int64_t outputs = 0;   // y's element count
  int64_t reduced = 0;   // x elements summed into each output
  bool inner_reduced = false;  // x's innermost (merged) dim is summed over
  int64_t splits = 1;
  int64_t per_split = 0;       // reduced positions per split
  std::vector<int64_t> kept_extents, kept_strides;        // x strides of the dims y keeps
  std::vector<int64_t> reduced_extents, reduced_strides;  // ... and of the summed dims
  // Floats of scratch that sum_to needs (0 when one split suffices).
  size_t scratch_floats() const {
    return splits > 1 ? static_cast<size_t>(splits * outputs) : 0;
  }
};

// Both shapes non-empty (numel > 0), y's shape broadcasts to x's and is smaller.
SumToPlan plan_sum_to(const Shape& x_shape, const Shape& y_shape);

// y = scale * (x summed over the plan's reduced dims), FP32 accumulation, rounded once.
// scratch: device memory of plan.scratch_floats() floats (null when that is 0).
void sum_to(const SumToPlan& plan, DType dtype, const void* x, void* y, float scale,
            float* scratch, cudaStream_t stream);

}  // namespace mixprec::kernels
