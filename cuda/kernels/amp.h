// Mixed-precision kernels: the multi-tensor unscale-and-check, per-tensor sums of squares,
// the clip by the total norm, the dynamic loss-scale update and the small kernels of
// deferred steps (the fused optimizer steps are in cuda/kernels/param_steps.h). The
// per-element math is core/math/amp.h, shared with the CPU backend. Internal to cuda/; launches are
// asynchronous on `stream`, and every flag they read or write stays on the device.
//
// The multi-tensor kernels take a table that lists every tensor and splits each into
// fixed-size chunks; one launch walks all chunks of all tensors, however many tensors an
// optimizer has. The caller copies the table's bytes to device memory (any 16-byte aligned
// block) ahead of the launch, on the same stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "core/dtype.h"
#include "core/math/amp.h"
#include "cuda/kernels/amp_table.h"

namespace mixprec::kernels {


// Every tensor's flag in `flags` (I32, table.tensors entries) becomes 1 when it holds a
// non-finite value and 0 otherwise; *found_inf becomes 1.0f when any tensor does and is left
// as it was when none does. With `write`, every element g becomes
// unscale_value(g, inv_scale) rounded once to its dtype (the CPU backend's bits); without it
// nothing is stored.
void unscale_and_check(const MultiTensorTable& table, const void* device_table, double inv_scale,
                       bool write, float* found_inf, int32_t* flags, cudaStream_t stream);

// unscale_and_check with inv_scale = 1.0 / S, S the scale of the DynamicScaleState held by
// `scale_state` (device I32 [kDynamicScaleStateWords]), computed in double on the device;
// `write` is inv_scale != 1, as the host-scale call decides it.
void unscale_and_check_on_device(const MultiTensorTable& table, const void* device_table,
                                 const int32_t* scale_state, float* found_inf, int32_t* flags,
                                 cudaStream_t stream);

// Backend::widen_gradients: every element of the F32 target of each table entry (the
// F16/BF16 sources; `device_block` holds the table's bytes, then its WidenTarget array at
// widen_targets_offset) becomes float(source), or target + float(source) rounded once where
// the target accumulates. One launch for all tensors.
void widen_gradients(const MultiTensorTable& table, const void* device_block,
                     cudaStream_t stream);

// out[t] (F32, table.tensors entries) = sum of squares of tensor t, FP32 accumulation:
// each chunk's sum by a fixed tree into partials (table.chunks floats of device scratch),
// then each tensor's chunk sums added in chunk order.
void squared_norms(const MultiTensorTable& table, const void* device_table, float* partials,
                   float* out, cudaStream_t stream);

// One thread sums squared_sums (F32, table.tensors values) in double in index order and
// writes *norm_out = float(sqrt(sum)) and *coef = clip_coefficient(norm, max_norm) (device
// scratch of one double); then, when *coef < 1, every element g of every tensor of the table
// (all F32) becomes affine_value(g, float(*coef), 0). The scale pass is queued whenever the
// table has chunks and returns at once on the device when *coef >= 1.
void clip_by_total_norm(const MultiTensorTable& table, const void* device_table,
                        const float* squared_sums, double max_norm, float* norm_out,
                        double* coef, cudaStream_t stream);

// One thread runs update_dynamic_scale(rule, state, *found_inf != 0) on the device. `state`
// holds the kDynamicScaleStateWords I32 of a DynamicScaleState (4-byte alignment suffices);
// found_inf is device F32 [1].
void update_loss_scale(const DynamicScaleRule& rule, int32_t* state, const float* found_inf,
                       cudaStream_t stream);

// ---- deferred steps (Backend's contracts in core/backend.h) ----------------------------------
// One thread: *out = float(S * weight), the product in double; `state` as update_loss_scale's.
void loss_scale_factor(const int32_t* state, double weight, float* out, cudaStream_t stream);

// One thread: *taken += 1 when *found_inf == 0 (a NaN flag leaves it).
void count_taken_step(const float* found_inf, int32_t* taken, cudaStream_t stream);

}  // namespace mixprec::kernels
