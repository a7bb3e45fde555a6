// TF32 rounding for the emulated libraries (cublaslt_emulation.cpp, cudnn_emulation.cpp):
// what tensor cores keep of an FP32 operand when TF32 is allowed.
#pragma once

#include <cstdint>
#include <cstring>

namespace mixprec::emulation {

// Rounds x to 10 fraction bits, to nearest even; Inf and NaN pass unchanged.
inline float to_tf32(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7F800000u) != 0x7F800000u) {
    bits += 0xFFFu + ((bits >> 13) & 1u);
    bits &= ~0x1FFFu;
  }
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

}  // namespace mixprec::emulation
