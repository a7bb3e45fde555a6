// MIXPREC_HD marks per-element math that both backends share: __host__ __device__ under
// nvcc, plain inline otherwise. The CPU tests of these functions then cover the arithmetic
// the GPU kernels run.
#pragma once

#if defined(__CUDACC__)
#define MIXPREC_HD __host__ __device__ __forceinline__
#else
#define MIXPREC_HD inline
#endif
