// Bulk conversions between FP32 and the 16-bit float formats (FP16, BF16), for casts, for
// loading FP16/BF16 tensors, and for keeping FP32 master weights beside FP16 copies.
//
// Contract:
// - Every element is converted exactly as the scalar functions of core/half.h do it (IEEE
//   round-to-nearest-even with subnormals, signed zeros, infinities; NaN stays NaN with its
//   sign, quiet, and the top payload bits that fit). The vectorized and scalar paths give the
//   same bits for every input, so results do not depend on which CPU ran them.
// - Results do not depend on the MXCSR rounding mode or FTZ/DAZ: the FP16 instructions take
//   an explicit rounding mode and ignore FTZ/DAZ, and the BF16 path is integer arithmetic.
// - src and dst must not overlap. n may be any size, including 0; no alignment is required.
// - The public functions pick the vector path at run time (__builtin_cpu_supports), so a
//   library built without -march=native still uses it where the CPU has the instructions.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mixprec {

void convert_f32_to_f16(const float* src, uint16_t* dst, size_t n);
void convert_f16_to_f32(const uint16_t* src, float* dst, size_t n);
void convert_f32_to_bf16(const float* src, uint16_t* dst, size_t n);
void convert_bf16_to_f32(const uint16_t* src, float* dst, size_t n);

namespace detail {

// The scalar paths: always available, and the definition the vector paths must match.
void convert_f32_to_f16_scalar(const float* src, uint16_t* dst, size_t n);
void convert_f16_to_f32_scalar(const uint16_t* src, float* dst, size_t n);
void convert_f32_to_bf16_scalar(const float* src, uint16_t* dst, size_t n);
void convert_bf16_to_f32_scalar(const uint16_t* src, float* dst, size_t n);

// The vector paths, using the widest instruction set below that this CPU has. They return
// false and write nothing when it has none of them.
bool convert_f32_to_f16_vector(const float* src, uint16_t* dst, size_t n);
bool convert_f16_to_f32_vector(const uint16_t* src, float* dst, size_t n);
bool convert_f32_to_bf16_vector(const float* src, uint16_t* dst, size_t n);
bool convert_bf16_to_f32_vector(const uint16_t* src, float* dst, size_t n);

// One instruction set each, so that a test on an AVX-512 machine also covers the AVX2 path
// that other machines take. Same return convention as above.
//   kAvx2:   AVX2 + F16C + FMA (8 lanes)
//   kAvx512: AVX-512 F + BW (16 lanes)
enum class VectorIsa { kAvx2, kAvx512 };
bool vector_isa_supported(VectorIsa isa);
bool convert_f32_to_f16_vector(VectorIsa isa, const float* src, uint16_t* dst, size_t n);
bool convert_f16_to_f32_vector(VectorIsa isa, const uint16_t* src, float* dst, size_t n);
bool convert_f32_to_bf16_vector(VectorIsa isa, const float* src, uint16_t* dst, size_t n);
bool convert_bf16_to_f32_vector(VectorIsa isa, const uint16_t* src, float* dst, size_t n);

}  // namespace detail
}  // namespace mixprec
