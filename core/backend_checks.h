// Argument validation of the Backend primitives (core/backend.h), shared by every backend so
// that the CPU and CUDA backends accept the same calls and refuse the others with the same
// messages. Each function throws mixprec::Error naming the primitive and the offending
// operand; the per-primitive ones also check that every tensor is defined and lives on
// `device`, the calling backend's device. Dtypes a primitive does not compute are refused
// later, by the backend's dispatch.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "core/device.h"
#include "core/math/pool_geometry.h"
#include "core/shape.h"

namespace mixprec {

class Tensor;

namespace backend_checks {

// ---- building blocks --------------------------------------------------------------------

// `t` is defined and lives on `device`; the message names `op` and `what` the tensor is.
void on_device(const char* op, const char* what, const Tensor& t, Device device);
// on_device for each (name, tensor) pair; null tensors are skipped.
void all_on_device(const char* op, Device device,
                   std::initializer_list<std::pair<const char*, const Tensor*>> operands);
// Every tensor of `ts` (null entries skipped) has the dtype of the first.
void same_dtype(const char* op, std::initializer_list<const Tensor*> ts);
void same_shape(const char* op, const Tensor& a, const Tensor& b);
// `in` broadcasts to `out` (right-aligned; each extent 1 or equal).
bool broadcasts_to(const Shape& in, const Shape& out);

// The row layout of a primitive that works on the last dimension: `cols` values per row.
struct Rows {
  int64_t rows = 0;
  int64_t cols = 0;
};

// x [N, C, H, W] convolved with the filter [O, C, KH, KW] into y [N, O, OH, OW].
struct Conv2dGeometry {
  int64_t n, c, h, w;  // input
  int64_t o, kh, kw;   // filter
  int64_t oh, ow;      // output
  int64_t sh, sw, ph, pw;
  int64_t rows() const { return c * kh * kw; }  // of the im2col matrix
  int64_t pixels() const { return oh * ow; }
  int64_t image() const { return c * h * w; }
};

// Batch norm's x [N, C, ...]: `inner` values per sample and channel.
struct Channels {
  int64_t n = 0;
  int64_t c = 0;
  int64_t inner = 0;
  int64_t count() const { return n * inner; }  // values per channel
};

// ---- fills, casts, copies -----------------------------------------------------------------
void cast(Device device, const Tensor& x, const Tensor& y);
void copy(Device device, const Tensor& x, const Tensor& y);
// Each item's source F16 or BF16, destination F32 of the same shape, both on `device`; no
// destination overlaps a source or another destination (sources may overlap each other).
void widen_gradients(Device device, const std::vector<GradientWidening>& items);

// ---- elementwise --------------------------------------------------------------------------
void unary(Device device, const Tensor& x, const Tensor& y);
void unary_backward(Device device, const Tensor& x, const Tensor& y, const Tensor& dy,
                    const Tensor& dx);
void affine(Device device, const Tensor& x, const Tensor& y);
void binary(Device device, const Tensor& a, const Tensor& b, const Tensor& out);
void sum_to(Device device, const Tensor& x, const Tensor& y);
void expand(Device device, const Tensor& x, const Tensor& y);
// Returns the rows and columns of the last two dims (x has at least two).
Rows causal_mask(Device device, const Tensor& x, const Tensor& y);

// ---- layout -----------------------------------------------------------------------------
void permute(Device device, const Tensor& x, const std::vector<int64_t>& perm, const Tensor& y);
void copy_narrow(Device device, const Tensor& src, int64_t dim, int64_t src_start,
                 const Tensor& dst, int64_t dst_start, int64_t length);
// split_heads and merge_heads (op names which): the extents of q, k and v [B, H, T, D].
struct Heads {
  int64_t batch = 0, heads = 0, time = 0, dim = 0;
};
Heads heads(const char* op, Device device, const Tensor& qkv, const Tensor& q, const Tensor& k,
            const Tensor& v);

// ---- GEMM and convolution ----------------------------------------------------------------
// Besides the usual checks, gemm refuses dtypes other than F32, F16 and BF16 itself (before
// the dtype-mismatch check), naming the backend of `device`. Limits of a backend's library
// (cuBLASLt's 32-bit batch count, cuDNN's int extents) are the backend's to check.
void gemm(Device device, const GemmDesc& desc, const Tensor& a, const Tensor& b, const Tensor& c);
// gemm's checks, then those of Backend::gemm_epilogue's contract: batch 1, beta 0, one dtype
// for a, b, c, bias and pre_gelu, bias [n] given exactly for the epilogues with a bias,
// pre_gelu given exactly for those with GELU and with at least m * n elements.
void gemm_epilogue(Device device, const GemmDesc& desc, GemmEpilogue epilogue, const Tensor& a,
                   const Tensor& b, const Tensor* bias, const Tensor& c, const Tensor* pre_gelu);
Conv2dGeometry conv2d(Device device, const Tensor& x, const Tensor& w, const Tensor* bias,
                      const Conv2dDesc& desc, const Tensor& y);
Conv2dGeometry conv2d_backward_data(Device device, const Tensor& dy, const Tensor& w,
                                    const Conv2dDesc& desc, const Tensor& dx);
Conv2dGeometry conv2d_backward_filter(Device device, const Tensor& x, const Tensor& dy,
                                      const Conv2dDesc& desc, const Tensor& dw,
                                      const Tensor* dbias);

// ---- neural-network primitives ----------------------------------------------------------
// Softmax rows are the last dim (a 0-d tensor is one row of one value).
Rows softmax(Device device, const Tensor& x, const Tensor& y);
Rows softmax_backward(Device device, const Tensor& y, const Tensor& dy, const Tensor& dx);
// attention_softmax: the last two extents {R, C} of the scores.
Rows attention_softmax(Device device, const Tensor& scores, float p, const Tensor& probs,
                       const Tensor& operand);
// attention_softmax_backward: rows and columns of the F32 probabilities.
Rows attention_softmax_backward(Device device, const Tensor& probs, const Tensor& dprobs, float p,
                                const Tensor& ds);
// Rows and classes of the [N, C] logits.
Rows cross_entropy(Device device, const Tensor& logits, const Tensor& labels, const Tensor& loss,
                   const Tensor& row_stats);
Rows cross_entropy_backward(Device device, const Tensor& logits, const Tensor& labels,
                            const Tensor& row_stats, const Tensor& dloss, const Tensor& dlogits);
Rows layer_norm(Device device, const Tensor& x, const Tensor* weight, const Tensor* bias,
                const Tensor& y, const Tensor& mean, const Tensor& rstd);
Rows layer_norm_backward(Device device, const Tensor& x, const Tensor* weight,
                         const Tensor& mean, const Tensor& rstd, const Tensor& dy,
                         const Tensor& dx, const Tensor* dweight, const Tensor* dbias);
// The number of ids and the row length of the [V, D] table.
Rows embedding(Device device, const Tensor& weight, const Tensor& ids, const Tensor& y);
Rows embedding_backward(Device device, const Tensor& ids, const Tensor& dy,
                        const Tensor& dweight);
void dropout(Device device, const Tensor& x, float p, const Tensor& y);
void dropout_add(Device device, const Tensor& residual, const Tensor& x, float p,
                 const Tensor& y);
// Weight, bias (and their gradients) hold one value per channel in x's dtype; the running
// and saved statistics are F32 [C]. Training needs more than one value per channel.
Channels batch_norm(Device device, const Tensor& x, const Tensor& weight, const Tensor& bias,
                    const Tensor& running_mean, const Tensor& running_var, bool training,
                    const Tensor& y, const Tensor& save_mean, const Tensor& save_invstd);
// relu_bias (may be null) as the forward's bias.
Channels batch_norm_backward(Device device, const Tensor& x, const Tensor& weight,
                             const Tensor& save_mean, const Tensor& save_invstd,
                             const Tensor& dy, const Tensor* relu_bias, const Tensor& dx,
                             const Tensor& dweight, const Tensor& dbias);
// The geometry of x [N, C, H, W] pooled into y [N, C, OH, OW].
Pool2dGeometry pool2d(Device device, const Pool2dDesc& desc, const Tensor& x, const Tensor& y,
                      const Tensor* argmax);
Pool2dGeometry pool2d_backward(Device device, const Pool2dDesc& desc, const Tensor& dy,
                               const Tensor* argmax, const Tensor& dx);

// ---- mixed precision --------------------------------------------------------------------
void unscale_and_check(Device device, const std::vector<Tensor>& grads, double inv_scale,
                       const Tensor& found_inf, const Tensor& tensor_flags);
void squared_norms(Device device, const std::vector<Tensor>& xs, const Tensor& out);
// The rule under DynamicLossScale's constraints; the state I32 [kDynamicScaleStateWords].
void update_loss_scale(Device device, const DynamicScaleRule& rule, const Tensor& state,
                       const Tensor& found_inf);

// ---- deferred steps ---------------------------------------------------------------------
// scale_state as update_loss_scale's state (its values are not read); weight finite, > 0.
void loss_scale_factor(Device device, const Tensor& scale_state, double weight,
                       const Tensor& out);
void unscale_and_check_on_device(Device device, const std::vector<Tensor>& grads,
                                 const Tensor& scale_state, const Tensor& found_inf,
                                 const Tensor& tensor_flags);
// The gradients are F32 (clipped in place); max_norm finite and > 0.
void clip_by_total_norm(Device device, const std::vector<Tensor>& grads,
                        const Tensor& squared_sums, double max_norm, const Tensor& norm_out);
void count_taken_step(Device device, const Tensor& found_inf, const Tensor& taken);
// Backend::adam_steps / sgd_steps (core/backend.h gives the contract): the operands and
// hyperparameters of every step, the message prefixed with the step's index; no null operand,
// no table on an immediate step and none missing on a deferred one; found_inf F32 [1] and taken
// I32 [1] whenever given, even with no steps; and no memory named twice in the whole call (a
// buffer of two steps, or of one step in two roles, or the flag or counter as a buffer).
void adam_steps(Device device, const std::vector<AdamParamStep>& steps, const Tensor* taken,
                const Tensor* found_inf);
void sgd_steps(Device device, const std::vector<SgdParamStep>& steps, const Tensor* taken,
               const Tensor* found_inf);

}  // namespace backend_checks
}  // namespace mixprec
