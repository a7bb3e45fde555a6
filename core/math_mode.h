// Process-wide math switches that backends read when they pick a kernel.
#pragma once

namespace mixprec {

// Whether FP32 GEMMs and convolutions may use TF32 tensor cores. Off by default (full FP32);
// the precision policy sets it (amp/precision.h). The CPU backend has no TF32 and ignores it.
bool tf32_allowed();
void set_tf32_allowed(bool allowed);

}  // namespace mixprec
