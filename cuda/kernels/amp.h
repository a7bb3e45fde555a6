// Mixed-precision kernels: the multi-tensor unscale-and-check, per-tensor sums of squares,
// the fused SGD and Adam/AdamW steps and the dynamic loss-scale update. The per-element math
// is core/math/amp.h, shared with the CPU backend. Internal to cuda/; launches are
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

// out[t] (F32, table.tensors entries) = sum of squares of tensor t, FP32 accumulation:
// each chunk's sum by a fixed tree into partials (table.chunks floats of device scratch),
// then each tensor's chunk sums added in chunk order.
void squared_norms(const MultiTensorTable& table, const void* device_table, float* partials,
                   float* out, cudaStream_t stream);

// sgd_update of n F32 master values from the F32 gradient; momentum (null when
// hyper.momentum == 0) is the F32 buffer; working (null for none) receives the new master
// rounded to working_dtype in the same pass. found_inf (device F32 [1] or null): when it
// holds a non-zero value the kernel returns without writing anything.
void sgd_step(const SgdHyper& hyper, float* master, const float* grad, float* momentum,
              void* working, DType working_dtype, int64_t n, const float* found_inf,
              cudaStream_t stream);

// adam_update of n F32 master values from the F32 gradient; exp_avg and exp_avg_sq are the
// F32 moment buffers. working and found_inf as in sgd_step: a non-zero flag leaves master,
// moments and working copy untouched.
void adam_step(const AdamHyper& hyper, float* master, const float* grad, float* exp_avg,
               float* exp_avg_sq, void* working, DType working_dtype, int64_t n,
               const float* found_inf, cudaStream_t stream);

// One thread runs update_dynamic_scale(rule, state, *found_inf != 0) on the device. `state`
// holds the kDynamicScaleStateWords I32 of a DynamicScaleState (4-byte alignment suffices);
// found_inf is device F32 [1].
void update_loss_scale(const DynamicScaleRule& rule, int32_t* state, const float* found_inf,
                       cudaStream_t stream);

}  // namespace mixprec::kernels
