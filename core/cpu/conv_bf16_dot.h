// The BF16 convolution filter gradient on the CPU's BF16 dot-product instruction
// (core/cpu/bf16_dot_gemm.h): the per-image products of an im2col convolution with the column
// matrix built in BF16 (a copy, no widening) and summed by gemm_bf16_dot. The CPU backend's
// BF16 filter gradients take it when bf16_dot_available() and the column matrix has enough
// rows (core/cpu/cpu_conv.cpp). The forward and the input gradient are not direct dot
// products: where Winograd applies, its transformed products take the dot products
// (core/cpu/cpu_winograd.h), which measured faster; elsewhere the widened FP32 kernels run.
//
// Numerics: per image, each element is one FP32 sum over the pixels of exact BF16 products in
// the dot-product order of bf16_dot_gemm.h; the images' sums are added in the order of the
// OpenMP workers that took them, as the FP32 kernel adds them, so the bits depend on the
// thread count. Each element is rounded once to BF16. BF16 denormal inputs count as zero (the
// instruction's rule; docs/numerics.md).
#pragma once

#include "core/backend_checks.h"
#include "core/half.h"

namespace mixprec::cpu {

// dw = sum over images of dy[n] @ col(x[n])^T, dbias (may be null) = sum of dy per output
// channel (FP32 lane sums of the widened values, as the FP32 kernel's), both overwritten.
// Requires bf16_dot_available().
void conv2d_backward_filter_bf16_dot(const bfloat16* x, const bfloat16* dy, bfloat16* dw,
                                     bfloat16* dbias, const backend_checks::Conv2dGeometry& g);

}  // namespace mixprec::cpu
