// Winograd F(2x2, 3x3) convolution of the CPU backend: the 3x3, stride-1, pad-1 convolutions
// of the CNNs (output as large as the input), forward and backward data, with 16
// multiplications per 2x2 output tile and channel pair where the direct product takes 36.
//
// Per image, tile (ty, tx) of the output covers rows 2ty, 2ty + 1 and columns 2tx, 2tx + 1;
// it reads the 4x4 input patch d from row 2ty - 1 and column 2tx - 1 (the padding and the
// cells past an odd edge read as 0). With the usual matrices of Lavin and Gray (2015),
//   U[o][c] = G w[o][c] G^T            (4x4, once per call)
//   V[c]    = B^T d[c] B               (4x4, per tile)
//   M[o]    = sum_c U[o][c] * V[c]     (elementwise: 16 products of [O x C] by [C x tiles])
//   y       = bias[o] + A^T M[o] A     (2x2, the outputs past an odd edge dropped)
// Every step is in FP32 with a fixed order of operations, so the results do not depend on the
// number of OpenMP threads. They differ from the direct convolution's by rounding only: the
// transforms add and subtract inputs (and halve filter sums) before the products.
//
// BF16 convolutions on a CPU with AVX512-BF16 (bf16_dot_available()) take the 16 products on
// the dot-product instruction instead: U and V, computed in FP32, are rounded to BF16 first,
// and each M is an FP32 dot-product sum over the input channels. The extra rounding of the
// transforms is the price of that speed: about twice the error of the output's own BF16
// rounding (docs/numerics.md).
#pragma once

#include <cstdint>

#include "core/backend_checks.h"
#include "core/half.h"

namespace mixprec::cpu {

// True when the convolution of geometry g takes the Winograd kernels below: a 3x3 kernel at
// stride 1 with padding 1 (so OH == H and OW == W), at least kWinogradMinChannels input and
// output channels, and the AVX-512 tile GEMM (tile_gemm_vectorised()). With fewer channels
// (the first layer of a CNN reads one) the transforms cost more than the multiplications
// they save. The test is symmetric in C and O, so it decides backward data as well.
inline constexpr int64_t kWinogradMinChannels = 8;
bool winograd_applies(const backend_checks::Conv2dGeometry& g);

// y = conv2d(x, w) (+ bias) for a geometry where winograd_applies(g) holds: x [N, C, H, W]
// and y [N, O, H, W] (overwritten) of T (float, half or bfloat16), w [O, C, 3, 3] and bias [O]
// (or null) in FP32. Every step is FP32: 16-bit images are widened a group at a time and each
// output is rounded once. Uses no cpu::scratch slot (its buffers are its own, per thread, kept
// between calls), so the caller may hold any of them. Parallel over groups of up to eight
// images outside a parallel region; on the calling thread inside one that cannot nest. Throws
// mixprec::Error when the geometry does not apply.
template <class T>
void winograd_conv2d(const T* x, const float* w, const float* bias, T* y,
                     const backend_checks::Conv2dGeometry& g);

// dx = the gradient of that convolution with respect to x, for dy [N, O, H, W] and
// w [O, C, 3, 3], dx [N, C, H, W] (overwritten). It is itself a 3x3 stride-1 pad-1
// convolution: dx[c] = sum_o conv(dy[o], rot180(w[o][c])), which runs through the forward's
// kernels with the filter transform reading w flipped and transposed. Same conditions as
// winograd_conv2d.
template <class T>
void winograd_conv2d_backward_data(const T* dy, const float* w, T* dx,
                                   const backend_checks::Conv2dGeometry& g);

}  // namespace mixprec::cpu
