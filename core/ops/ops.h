// The differentiable ops. Each is defined in its own file under core/ops/ with its backward
// next to it; each checks its inputs and throws mixprec::Error naming the op, the shapes and
// the dtypes on bad input. Floating inputs of one op share a dtype (mix dtypes explicitly
// with Tensor::to); F16/BF16 compute in FP32 and round once on store.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/tensor.h"

namespace mixprec {
class Generator;
}

namespace mixprec::ops {

// ---- conversions and layout ----------------------------------------------------------------
Tensor cast(const Tensor& x, DType dtype);                 // gradient cast back to x's dtype
Tensor reshape(const Tensor& x, const Shape& shape);       // one extent may be -1
// Merges dims start_dim..end_dim into one (torch.flatten: all of them by default).
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& perm);
Tensor concat(const std::vector<Tensor>& xs, int64_t dim);
// Pieces of the given sizes along `dim` (sizes must sum to the extent).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
// The q, k and v heads [B, H, T, D] of qkv [B, T, 3 * n_head * D] (a fused projection's
// output): split into three along the last dim, each viewed as [B, T, H, D] and permuted to
// [B, H, T, D], in one pass.
std::vector<Tensor> split_heads(const Tensor& qkv, int64_t n_head);
// x[.., start:end, ..] along `dim` (end exclusive; negative values count from the end).
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end);

// ---- elementwise -------------------------------------------------------------------------------
// NumPy broadcasting between a and b.
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add_scalar(const Tensor& x, double s);
Tensor mul_scalar(const Tensor& x, double s);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor square(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x);  // tanh approximation, as GPT-2
Tensor sigmoid(const Tensor& x);
Tensor tanh(const Tensor& x);

// ---- reductions (FP32 accumulation; result in x's dtype) ---------------------------------
Tensor sum(const Tensor& x);  // all elements -> scalar
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);

// ---- linear algebra ----------------------------------------------------------------------------
// a [..., m, k] (or [..., k, m] when trans_a), b [..., k, n] (or [..., n, k] when trans_b);
// 2-D b broadcasts over a's batch. Result [..., m, n].
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
// x [..., in], weight [out, in], bias [out] (may be undefined) -> [..., out].
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
// gelu(linear(x, weight, bias)) as one op: gelu (tanh form) is applied to the FP32 sums
// before their one rounding, so the result can differ from the composed ops, which round the
// linear's output first, by one rounding of the output's dtype. bias may be undefined.
Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// ---- convolution and pooling (NCHW) ----------------------------------------------------------
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              int64_t stride = 1, int64_t padding = 0);
Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride = -1, int64_t padding = 0);
Tensor avg_pool2d(const Tensor& x, int64_t kernel, int64_t stride = -1, int64_t padding = 0);

// ---- normalisation, activations with state, losses ------------------------------------------
Tensor softmax(const Tensor& x);      // last dim, FP32 math
Tensor log_softmax(const Tensor& x);  // last dim, FP32 math
// logits [N, C] floating, labels I32 [N] in [0, C). Mean over N, F32 scalar.
Tensor cross_entropy(const Tensor& logits, const Tensor& labels);
// mean((a - b)^2) over all elements, F32 scalar.
Tensor mse_loss(const Tensor& a, const Tensor& b);
// Over the last dim; weight/bias [D] (may be undefined).
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
// x [N, C, H, W]; weight, bias [C]; running_mean/var F32 [C] updated in place when training.
// relu: returns relu(batch_norm2d(...)) from one op, bit for bit the two ops' result forward
// and backward, without the intermediate tensor or relu's passes over it.
Tensor batch_norm2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
                    Tensor& running_mean, Tensor& running_var, bool training,
                    double momentum = 0.1, double eps = 1e-5, bool relu = false);
// weight [V, D], ids I32 of any shape in [0, V) -> [ids..., D].
Tensor embedding(const Tensor& weight, const Tensor& ids);
// Identity when !training or p == 0; else zeroes with probability p and scales by 1/(1-p).
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen);
// residual + dropout(x, p, training, gen) for tensors of one shape, dtype and device: the same
// mask from the same counters of `gen`, and bit for bit add(residual, dropout(...)), in one
// pass (Backend::dropout_add) where dropout and the add would take two.
Tensor dropout_add(const Tensor& residual, const Tensor& x, double p, bool training,
                   Generator& gen);
// q, k, v [B, H, T, D] -> [B, H, T, D]: softmax(q k^T / sqrt(D) + causal mask) v, with the
// mask and the softmax applied in FP32.
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v);
// The same with attention dropout when training and dropout_p > 0 (nanoGPT's attn_dropout):
// each F32 probability is zeroed with probability dropout_p and the survivors scaled by
// 1 / (1 - dropout_p) before the product with v; the mask takes B*H*T*T counters of `gen`
// (the same mask ops::dropout would draw on the probabilities) and the backward replays it.
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double dropout_p,
                        bool training, Generator& gen);

// ---- observation -----------------------------------------------------------------------------
// The identity (same values, shape, dtype and storage) as a new node in the graph: backward
// calls on_grad with the gradient w.r.t. the result (x's shape and dtype) and passes it on
// unchanged. on_grad runs inside backward under NoGradGuard, once per backward that reaches
// the node; the tensor may be read there, not written, and must be clone()d to be kept past
// the call. When x needs no gradient (or grad mode is off) nothing is recorded, x itself is
// returned and on_grad is never called. Throws for an undefined x or an empty on_grad.
Tensor grad_tap(const Tensor& x, std::function<void(const Tensor& grad)> on_grad);

}  // namespace mixprec::ops

namespace mixprec {
inline Tensor operator+(const Tensor& a, const Tensor& b) { return ops::add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return ops::sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return ops::mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return ops::div(a, b); }
inline Tensor operator+(const Tensor& a, double s) { return ops::add_scalar(a, s); }
inline Tensor operator-(const Tensor& a, double s) { return ops::add_scalar(a, -s); }
inline Tensor operator*(const Tensor& a, double s) { return ops::mul_scalar(a, s); }
inline Tensor operator/(const Tensor& a, double s) { return ops::mul_scalar(a, 1.0 / s); }
inline Tensor operator*(double s, const Tensor& a) { return ops::mul_scalar(a, s); }
inline Tensor operator-(const Tensor& a) { return ops::neg(a); }
}  // namespace mixprec
