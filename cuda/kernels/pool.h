// 2-D max and average pooling on the CUDA backend, with the window rules of
// core/math/pool.h and the geometry of core/math/pool_geometry.h (the CPU backend's).
// Internal to cuda/; pointers are device memory of NCHW tensors, launches are asynchronous
// on `stream`, and nothing is launched for empty work.
//
// The forward gives every output its own thread, which scans its window in row-major order
// as the CPU does (so max pooling picks the same argmax and both are bit-exact). The
// backward is a gather: every input cell is owned by one thread that adds the contributions
// of the outputs whose windows cover it, in output order, with no atomics, so each value is
// summed in the CPU's order and the result is the same on every run.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/dtype.h"
#include "core/math/pool_geometry.h"
#include "core/op_kinds.h"

namespace mixprec::kernels {

// y [planes, oh, ow] from x [planes, h, w]; argmax (I32, y's shape, flat index into the
// plane; -1 for a window with no cells) is written for max pooling when not null.
void pool2d(PoolKind kind, DType dtype, const Pool2dGeometry& g, const void* x, void* y,
            int32_t* argmax, cudaStream_t stream);

// dx [planes, h, w] (overwritten) from dy [planes, oh, ow]; max pooling routes each dy to
// its argmax (required), average pooling spreads it over the window.
void pool2d_backward(PoolKind kind, DType dtype, const Pool2dGeometry& g, const void* dy,
                     const int32_t* argmax, void* dx, cudaStream_t stream);

}  // namespace mixprec::kernels
