// The multi-tensor optimizer steps: one launch updates every parameter of a
// ParamStepTable (cuda/kernels/param_step_table.h), one block per piece of kParamStepChunk
// elements, with the per-element math of core/math/amp.h (sgd_update, adam_update) that the
// CPU backend also runs. Where the compiler fuses a multiply and an add (nvcc does by
// default), a master may differ from the CPU's by an ulp: the tests allow FP32 tolerance.
// Internal to cuda/; launches are asynchronous on `stream`.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "cuda/kernels/param_step_table.h"

namespace mixprec::kernels {

// found_inf (device F32 [1] or null): when it holds a non-zero value (NaN included) nothing
// is written. taken (device I32 [1] or null): parameter p uses its rate j = *taken (0 when
// null) and is left untouched when j is outside [0, rates_count). `device_table` holds
// table.bytes (16-byte aligned), copied ahead of the launch on the same stream.
void adam_steps(const ParamStepTable& table, const void* device_table, const int32_t* taken,
                const float* found_inf, cudaStream_t stream);
void sgd_steps(const ParamStepTable& table, const void* device_table, const int32_t* taken,
               const float* found_inf, cudaStream_t stream);

}  // namespace mixprec::kernels
