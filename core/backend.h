// Backend: the device-specific primitives that every op is built from. Ops in core/ops/
// check shapes and dtypes, allocate outputs and record the graph; a backend only computes.
//
// Contract shared by every primitive:
// - Tensors are contiguous row-major and live on this backend's device. Output tensors are
//   allocated by the caller with their final shape and dtype; primitives OVERWRITE them
//   unless the signature says `accumulate`.
// - Floating inputs may be F32, F16 or BF16. Values are loaded, converted to FP32, computed
//   and accumulated in FP32, and rounded once to the output dtype on store.
// - Statistics that the op keeps for its backward (per-row max and log-sum, mean, rstd,
//   ...) are F32.
// - A dtype a primitive does not support throws mixprec::Error naming the primitive.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/math/amp.h"
#include "core/op_kinds.h"
#include "core/philox.h"
#include "core/step_graphs.h"

namespace mixprec {

class Tensor;

// C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b] for b in [0, batch), row-major.
// op(A) is m x k (A stored k x m when trans_a), op(B) is k x n (B stored n x k when trans_b).
// stride_* is the element distance between consecutive batch items; 0 broadcasts one
// matrix to the whole batch. beta == 0 never reads C (so uninitialised C is fine).
// alpha and beta are applied in FP32, before C's one rounding (none when C is F32).
struct GemmDesc {
  bool trans_a = false;
  bool trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  float alpha = 1.0f;
  float beta = 0.0f;
};

// What a linear layer's GEMM does to each FP32 sum s = alpha * (op(A) @ op(B))[i, j] before
// its one rounding into C (Backend::gemm_epilogue).
enum class GemmEpilogue {
  Bias,      // C[i, j] = round(s + bias[j])
  Gelu,      // pre[i, j] = round(s), C[i, j] = round(gelu_tanh(s))
  BiasGelu,  // pre[i, j] = round(s + bias[j]), C[i, j] = round(gelu_tanh(s + bias[j]))
};

inline bool epilogue_has_bias(GemmEpilogue e) { return e != GemmEpilogue::Gelu; }
inline bool epilogue_has_gelu(GemmEpilogue e) { return e != GemmEpilogue::Bias; }

// One parameter's share of Backend::adam_steps: its update's operands and, for a
// deferred step, its rate table. The pointers must stay valid for the call.
struct AdamParamStep {
  AdamHyper hyper;                       // immediate: complete (set_step called); deferred: base
  const AdamRateTable* table = nullptr;  // deferred steps only
  Tensor* master = nullptr;
  const Tensor* grad = nullptr;
  Tensor* exp_avg = nullptr;
  Tensor* exp_avg_sq = nullptr;
  Tensor* working = nullptr;  // null: no working copy
};

// One parameter's share of Backend::sgd_steps, as AdamParamStep.
struct SgdParamStep {
  SgdHyper hyper;                       // immediate: complete; deferred: base
  const SgdRateTable* table = nullptr;  // deferred steps only
  Tensor* master = nullptr;
  const Tensor* grad = nullptr;
  Tensor* momentum = nullptr;  // required when hyper.momentum != 0
  Tensor* working = nullptr;   // null: no working copy
};

// One leaf gradient of Backend::widen_gradients. The pointers must stay valid for the call.
struct GradientWidening {
  const Tensor* source = nullptr;       // F16 or BF16: the gradient the backward computed
  Tensor* destination = nullptr;        // F32 of the same shape: the leaf's .grad
  bool accumulate = false;              // add into destination rather than overwrite it
};

// 2-D convolution of NCHW input with OIHW weights (groups = 1, dilation = 1).
struct Conv2dDesc {
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
};

// 2-D pooling over NCHW. Avg pooling counts padded cells in the divisor (PyTorch's
// count_include_pad=True default); max pooling ignores them.
struct Pool2dDesc {
  PoolKind kind = PoolKind::Max;
  int64_t kernel_h = 2, kernel_w = 2;
  int64_t stride_h = 2, stride_w = 2;
  int64_t pad_h = 0, pad_w = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;

  // ---- memory -------------------------------------------------------------------------
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) noexcept = 0;
  virtual void copy_from_host(void* dst, const void* host_src, size_t nbytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, size_t nbytes) = 0;
  // Waits for all queued work (a no-op on the CPU).
  virtual void synchronize() {}

  // ---- fills, casts, copies -------------------------------------------------------------
  virtual void fill(Tensor& out, double value) = 0;
  // out[i] = start + i * step (any dtype, I32 included).
  virtual void arange(Tensor& out, double start, double step) = 0;
  virtual void random_uniform(Tensor& out, PhiloxKey key, float low, float high) = 0;
  virtual void random_normal(Tensor& out, PhiloxKey key, float mean, float stddev) = 0;
  // Same number of elements, any dtypes (float -> I32 truncates toward zero).
  virtual void cast(const Tensor& x, Tensor& y) = 0;
  // Same dtype and number of elements: a raw copy.
  virtual void copy(const Tensor& x, Tensor& y) = 0;
  // The 16-bit gradients of a backward's leaves into their F32 .grad buffers, all in one
  // call (the autograd engine gathers them for the end of the pass, so a GPU widens every
  // parameter's gradient in one launch instead of one each). For each item, every element
  // of the destination becomes float(source) or, with accumulate, destination + float(source)
  // rounded once to F32: the bits of cast() into F32 followed, with accumulate, by
  // binary(Add). Sources may share memory with each other (the engine can hand one tensor
  // to several leaves); a destination may share memory with nothing else in the call.
  virtual void widen_gradients(const std::vector<GradientWidening>& items) = 0;

  // ---- elementwise ------------------------------------------------------------------------
  virtual void unary(UnaryOp op, const Tensor& x, Tensor& y) = 0;
  // dx = dy * f'(x); `y` = f(x) is passed for ops whose derivative is cheaper from the output
  // (exp, sqrt, sigmoid, tanh). x, y and dy have the same shape; dx is overwritten.
  virtual void unary_backward(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& dy,
                              Tensor& dx) = 0;
  // y = alpha * x + beta.
  virtual void affine(const Tensor& x, float alpha, float beta, Tensor& y) = 0;
  // out = a (op) b with NumPy broadcasting of a and b to out's shape. Same dtype for all.
  virtual void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) = 0;
  // y = scale * (x summed over the dimensions where y is broadcast), FP32 accumulation.
  // y's shape must broadcast to x's shape (right-aligned, each extent 1 or equal).
  virtual void sum_to(const Tensor& x, Tensor& y, float scale) = 0;
  // y = scale * x broadcast to y's shape.
  virtual void expand(const Tensor& x, Tensor& y, float scale) = 0;
  // Sets y[..., i, j] = fill for j > i over the last two dims, else copies x. Same dtype and
  // shape; y may alias x (masking in place).
  virtual void causal_mask(const Tensor& x, float fill, Tensor& y) = 0;

  // ---- layout -----------------------------------------------------------------------------
  // y.shape[i] == x.shape[perm[i]].
  virtual void permute(const Tensor& x, const std::vector<int64_t>& perm, Tensor& y) = 0;
  // Copies src[.., src_start : src_start+length, ..] into dst[.., dst_start : .., ..] along
  // `dim`; all other extents equal. Same dtype (any, I32 included); the rest of dst is kept.
  virtual void copy_narrow(const Tensor& src, int64_t dim, int64_t src_start, Tensor& dst,
                           int64_t dst_start, int64_t length) = 0;
  // The heads of a fused q/k/v projection, in one pass: qkv [B, T, 3 * H * D] into q, k and v
  // [B, H, T, D], with q[b, h, t, d] = qkv[b, t, h * D + d] and k and v from the next two
  // H * D blocks of each row. One dtype, any; values move unchanged. The outputs must not
  // overlap the input.
  virtual void split_heads(const Tensor& qkv, Tensor& q, Tensor& k, Tensor& v) = 0;
  // The inverse of split_heads: qkv [B, T, 3 * H * D] from q, k and v [B, H, T, D].
  virtual void merge_heads(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& qkv) = 0;

  // ---- GEMM -------------------------------------------------------------------------------
  // a and b share one floating dtype (F32, F16 or BF16); the products accumulate in FP32.
  // c either has that dtype too (rounded once on store) or is F32 while a and b are F16 or
  // BF16: the FP32 result is then written without any rounding, and beta reads C as FP32
  // (cuBLAS's 16-bit inputs with a CUDA_R_32F output), so a consumer that continues in FP32
  // (attention scores into the softmax) never sees a 16-bit overflow or an extra rounding.
  // Any other combination (F32 inputs into a 16-bit C, F16 with BF16, I32) throws naming the
  // dtypes.
  virtual void gemm(const GemmDesc& desc, const Tensor& a, const Tensor& b, Tensor& c) = 0;
  // One product of batch 1 with beta 0 and the epilogue fused (GemmEpilogue states the values
  // stored): a, b, bias ([n], given exactly for the epilogues with a bias) and c share one
  // floating dtype; the bias is read as FP32 and added before the one rounding. The GELU
  // epilogues also store the (biased) sum into *pre_gelu (m x n, c's dtype, what gelu's
  // backward reads) and apply gelu_tanh (core/math/elementwise.h) to the unrounded sum, as
  // cuBLASLt's GELU_AUX(_BIAS) epilogues do; Bias takes pre_gelu == nullptr.
  virtual void gemm_epilogue(const GemmDesc& desc, GemmEpilogue epilogue, const Tensor& a,
                             const Tensor& b, const Tensor* bias, Tensor& c,
                             Tensor* pre_gelu) = 0;

  // ---- neural-network primitives ---------------------------------------------------------
  // Softmax (or log-softmax) over the last dim, FP32 math, y in x's dtype.
  virtual void softmax(const Tensor& x, Tensor& y, bool log) = 0;
  virtual void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx, bool log) = 0;
  // Causal attention's probabilities in one pass per row (what causal_attention's forward
  // runs between its two GEMMs). scores: F32 [..., R, C], at least 2 dims. Writes
  //   probs   = softmax over the last dim of causal_mask(scores, -inf)        (F32)
  //   operand = dropout(probs, p, key) rounded once to operand's floating dtype
  //             (with p == 0 no dropout: probs rounded)
  // bit for bit what causal_mask, softmax, dropout and cast compose to on the same backend.
  // probs and operand have scores' shape. probs may be scores itself (in place); operand may
  // be scores or probs itself only when it is F32 and p == 0 (anything else throws). Other
  // overlaps are not allowed. p in [0, 1).
  virtual void attention_softmax(const Tensor& scores, float p, PhiloxKey key, Tensor& probs,
                                 Tensor& operand) = 0;
  // The backward of attention_softmax's dropout and softmax in one pass per row: probs and
  // dprobs F32 [..., C], ds floating of their shape,
  //   ds = softmax_backward(probs, dropout(dprobs, p, key)) rounded once to ds's dtype,
  // bit for bit dropout, softmax_backward and cast composed on the same backend. ds may be
  // probs or dprobs itself only when it is F32 (anything else throws). p in [0, 1) (0: no
  // dropout).
  virtual void attention_softmax_backward(const Tensor& probs, const Tensor& dprobs, float p,
                                          PhiloxKey key, Tensor& ds) = 0;
  // logits [N, C] floating, labels I32 [N] already validated in [0, C).
  // loss: F32 scalar = mean over N of -log softmax(logits)[label].
  // row_stats: F32 [N, 2] for the backward, per row the maximum logit m and
  // log(sum exp(logit - m)), kept apart (see core/math/softmax.h).
  virtual void cross_entropy(const Tensor& logits, const Tensor& labels, Tensor& loss,
                             Tensor& row_stats) = 0;
  // dlogits = dloss / N * (softmax(logits) - onehot(labels)); dloss is an F32 scalar.
  virtual void cross_entropy_backward(const Tensor& logits, const Tensor& labels,
                                      const Tensor& row_stats, const Tensor& dloss,
                                      Tensor& dlogits) = 0;
  // Normalises over the last dim. weight/bias ([D], may be null) share x's dtype.
  // mean and rstd: F32 [rows].
  virtual void layer_norm(const Tensor& x, const Tensor* weight, const Tensor* bias, float eps,
                          Tensor& y, Tensor& mean, Tensor& rstd) = 0;
  // dweight/dbias (may be null) are overwritten.
  virtual void layer_norm_backward(const Tensor& x, const Tensor* weight, const Tensor& mean,
                                   const Tensor& rstd, const Tensor& dy, Tensor& dx,
                                   Tensor* dweight, Tensor* dbias) = 0;
  // x NCHW; weight, bias [C] in x's dtype; running stats F32 [C], updated in place when
  // training (unbiased variance, PyTorch's momentum convention). save_mean/save_invstd F32
  // [C]: the batch statistics when training, the running ones otherwise. relu: y is
  // relu(batch norm) in one pass, bit for bit what a separate relu of the stored batch norm
  // gives (NaN kept, as unary relu).
  virtual void batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                          Tensor& running_mean, Tensor& running_var, bool training,
                          float momentum, float eps, bool relu, Tensor& y, Tensor& save_mean,
                          Tensor& save_invstd) = 0;
  // relu_bias: null for a plain batch norm. For one run with relu, its bias: dy is first
  // passed through relu's derivative at the batch norm output, which is recomputed from x
  // and rounded to x's dtype as the forward stored it (so the result is bit for bit that of
  // the unfused relu backward followed by batch_norm_backward), and nothing else is read.
  virtual void batch_norm_backward(const Tensor& x, const Tensor& weight,
                                   const Tensor& save_mean, const Tensor& save_invstd,
                                   const Tensor& dy, bool training, const Tensor* relu_bias,
                                   Tensor& dx, Tensor& dweight, Tensor& dbias) = 0;
  // x [N, C, H, W], w [O, C, KH, KW], bias [O] or null, y [N, O, OH, OW].
  virtual void conv2d(const Tensor& x, const Tensor& w, const Tensor* bias,
                      const Conv2dDesc& desc, Tensor& y) = 0;
  virtual void conv2d_backward_data(const Tensor& dy, const Tensor& w, const Conv2dDesc& desc,
                                    Tensor& dx) = 0;
  // dw and dbias (may be null) are overwritten.
  virtual void conv2d_backward_filter(const Tensor& x, const Tensor& dy, const Conv2dDesc& desc,
                                      Tensor& dw, Tensor* dbias) = 0;
  // argmax (I32, y's shape, flat index into each input plane) is written for max pooling.
  virtual void pool2d(const Pool2dDesc& desc, const Tensor& x, Tensor& y, Tensor* argmax) = 0;
  virtual void pool2d_backward(const Pool2dDesc& desc, const Tensor& dy, const Tensor* argmax,
                               Tensor& dx) = 0;
  // weight [V, D], ids I32 (any shape, already validated in [0, V)), y [ids..., D].
  virtual void embedding(const Tensor& weight, const Tensor& ids, Tensor& y) = 0;
  // dweight [V, D] overwritten with the scatter-sum of dy rows; deterministic order.
  virtual void embedding_backward(const Tensor& ids, const Tensor& dy, Tensor& dweight) = 0;
  // y = x * keep / (1 - p), keep drawn from `key` per element (same key, same mask, so the
  // backward is the same call on dy).
  virtual void dropout(const Tensor& x, float p, PhiloxKey key, Tensor& y) = 0;
  // y = residual + dropout(x, p, key): bit for bit dropout() into a tensor of x's dtype
  // followed by binary(Add, residual, that), in one pass (a transformer's residual branch
  // ends so). residual, x and y share one dtype and shape; y may be residual or x.
  virtual void dropout_add(const Tensor& residual, const Tensor& x, float p, PhiloxKey key,
                           Tensor& y) = 0;

  // ---- checks -----------------------------------------------------------------------------
  // True when every element of a floating tensor is finite (I32: always true).
  virtual bool all_finite(const Tensor& x) = 0;
  // Index of the first element outside [0, upper) of an I32 tensor, or -1.
  virtual int64_t find_out_of_range(const Tensor& ids, int64_t upper) = 0;

  // ---- mixed precision (per-element math in core/math/amp.h) -----------------------------
  // The unscale pass of one optimizer's gradients, in one call. Every element g of every
  // tensor in `grads` (floating, any shapes, written in place) becomes
  // unscale_and_check_value(g, inv_scale): the product in double rounded once to the tensor's
  // dtype; inv_scale == 1 leaves the values untouched (a pure check). tensor_flags (I32
  // [grads.size()]) is overwritten: 1 where that tensor held a value that was non-finite
  // before the pass or became non-finite by it (S < 1), else 0. found_inf (F32 [1]) is set
  // to 1 when any tensor did and is never cleared here, so several calls can share one flag.
  virtual void unscale_and_check(const std::vector<Tensor>& grads, double inv_scale,
                                 Tensor& found_inf, Tensor& tensor_flags) = 0;
  // out (F32 [xs.size()], overwritten): out[i] = sum of squares of xs[i], FP32 accumulation
  // in an order fixed by the shape (the same bits on every run and thread count).
  virtual void squared_norms(const std::vector<Tensor>& xs, Tensor& out) = 0;
  // One run of update_dynamic_scale(rule, state, found_inf[0] != 0) on the backend's device,
  // without a host round-trip: `state` (I32 [kDynamicScaleStateWords]) holds the bytes of a
  // DynamicScaleState (layout in core/math/amp.h) and is updated in place; found_inf is the
  // F32 [1] flag of the step's unscale_and_check (a NaN counts as set). The scale trajectory
  // thus stays on the device; the host reads the state back only when it logs it. The rule
  // is validated here; the state is not (on a device that would cost a read-back).
  virtual void update_loss_scale(const DynamicScaleRule& rule, Tensor& state,
                                 const Tensor& found_inf) = 0;

  // ---- deferred steps: the skip decided on the device (amp/deferred_steps.h) -----------
  // `scale_state` is a dynamic-scale state tensor as in update_loss_scale (I32
  // [kDynamicScaleStateWords]); S is its scale.
  // out (F32 [1], overwritten) = S * weight, the product in double rounded once to float:
  // the factor GradScaler::scale multiplies the loss by, without the host knowing S.
  virtual void loss_scale_factor(const Tensor& scale_state, double weight, Tensor& out) = 0;
  // unscale_and_check with inv_scale = 1.0 / S computed in double on the device; otherwise
  // exactly the host-scale overload above (S == 1 is a pure check).
  virtual void unscale_and_check_on_device(const std::vector<Tensor>& grads,
                                           const Tensor& scale_state, Tensor& found_inf,
                                           Tensor& tensor_flags) = 0;
  // clip_grad_norm's rescale without a host read. squared_sums: F32 [grads.size()] from
  // squared_norms(grads). norm = sqrt of their sum, accumulated in double in index order;
  // norm_out (F32 [1], overwritten) = norm rounded to float. When clip_coefficient(norm,
  // max_norm) < 1, every element g of every grad (F32, in place) becomes
  // affine_value(g, float(coef), 0); otherwise nothing is written. max_norm: finite, > 0.
  virtual void clip_by_total_norm(const std::vector<Tensor>& grads, const Tensor& squared_sums,
                                  double max_norm, Tensor& norm_out) = 0;
  // ---- optimizer steps: every parameter of an optimizer in one call ----------------------
  // The one form of each optimizer update. Step i updates the F32 master *steps[i].master
  // from its F32 true-scale gradient (same shape), element by element:
  // - SGD (sgd_update): *momentum, an F32 buffer of the master's shape, is required when
  //   hyper.momentum != 0.
  // - Adam and AdamW (adam_update): *exp_avg and *exp_avg_sq are F32 moment buffers of the
  //   master's shape, updated in place. hyper is checked as torch.optim.Adam checks its
  //   arguments, and the fields set_step() derives must match hyper.step.
  // - working: the F16/BF16 working copy (or a distinct F32 tensor), rewritten from the new
  //   master in the same pass; null for none.
  // - found_inf (F32 [1]; NaN counts as set): when it holds a non-zero value nothing is
  //   written, not even the moments, so a device-resident overflow flag skips the step
  //   without a host round-trip. Null: always applied (taken must then be null too).
  // - With taken null each step's hyper is complete (Adam: set_step called) and has no table.
  //   With taken (I32 [1], the steps taken since the host last resolved; found_inf required)
  //   the per-step values are picked on the device: j = taken[0], then the update of
  //   sgd_hyper_with(hyper, table->entry[j]) (adam_hyper_with for Adam); j outside
  //   [0, table->count) writes nothing. Every entry below count is checked on the host as a
  //   complete hyper is.
  // One pass over all parameters (one launch on a GPU, however many there are). Everything is
  // checked before anything is written (the message names the step), and no two operands may
  // share memory (a master, gradient, state buffer or working copy of any step, found_inf,
  // taken). The CPU backend runs the updates in order.
  virtual void adam_steps(const std::vector<AdamParamStep>& steps, const Tensor* taken,
                          const Tensor* found_inf) = 0;
  virtual void sgd_steps(const std::vector<SgdParamStep>& steps, const Tensor* taken,
                         const Tensor* found_inf) = 0;
  // taken[0] (I32 [1]) += 1 when found_inf[0] (F32 [1]) is 0; a non-zero or NaN flag leaves
  // it. Queued after an optimizer's deferred updates, so they all read the count before it.
  virtual void count_taken_step(const Tensor& found_inf, Tensor& taken) = 0;

  // Recording and replay of a training step's work (core/step_graphs.h); null (the default)
  // where the device cannot record.
  virtual std::unique_ptr<StepGraphs> make_step_graphs() { return nullptr; }
};

// The backend that owns `device`; throws when none is registered (e.g. CUDA not built, or
// no device present).
Backend& backend_for(Device device);
bool has_backend(DeviceType type);
// Installs the backend for a device type (the CUDA library calls this at start-up).
void register_backend(DeviceType type, std::unique_ptr<Backend> backend);

}  // namespace mixprec
