#include "core/backend_checks.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/math/window.h"
#include "core/tensor.h"

namespace mixprec::backend_checks {
namespace {


void same_numel(const char* op, const Tensor& a, const Tensor& b) {
  MIXPREC_CHECK(a.numel() == b.numel(), op, ": ", describe(a), " and ", describe(b),
                " differ in size");
}


// The F32 [rows] statistics of layer norm.
void row_statistics(const char* op, const Tensor& mean, const Tensor& rstd, int64_t rows) {
  MIXPREC_CHECK(mean.dtype() == DType::F32 && rstd.dtype() == DType::F32 &&
                    mean.numel() == rows && rstd.numel() == rows,
                op, ": mean ", describe(mean), " and rstd ", describe(rstd), " must be F32 [",
                rows, "]");
}

// A per-column parameter (or its gradient) of layer norm: x's dtype, `cols` elements.
void column_parameter(const char* op, const char* what, const Tensor* p, const Tensor& x,
                      int64_t cols) {
  if (p == nullptr) return;
  MIXPREC_CHECK(p->dtype() == x.dtype() && p->numel() == cols, op, ": ", what, " ",
                describe(*p), " must be [", cols, "] of the input's dtype (input ", describe(x),
                ")");
}

Rows last_dim_rows(const Tensor& x) {
  const int64_t cols = x.dim() == 0 ? 1 : x.size(-1);
  return {cols == 0 ? 0 : x.numel() / cols, cols};
}

// The [N, C] logits and their I32 [N] labels.
Rows logits_rows(const char* op, const Tensor& logits, const Tensor& labels) {
  MIXPREC_CHECK(logits.dim() == 2, op, ": logits must be [N, C], got ", describe(logits));
  const Rows r{logits.size(0), logits.size(1)};
  MIXPREC_CHECK(labels.dtype() == DType::I32 && labels.numel() == r.rows, op, ": labels ",
                describe(labels), " must be I32 [", r.rows, "] for logits ", describe(logits));
  return r;
}

Pool2dGeometry pool_geometry(const char* op, const Pool2dDesc& d, const Shape& x, const Shape& y) {
  MIXPREC_CHECK(x.size() == 4 && y.size() == 4, op, ": expected 4-D input and output, got ",
                shape_str(x), " and ", shape_str(y));
  MIXPREC_CHECK(d.kernel_h >= 1 && d.kernel_w >= 1 && d.stride_h >= 1 && d.stride_w >= 1 &&
                    d.pad_h >= 0 && d.pad_w >= 0,
                op, ": invalid kernel, stride or padding");
  Pool2dGeometry g{.planes = x[0] * x[1], .h = x[2], .w = x[3], .oh = y[2], .ow = y[3],
                   .kh = d.kernel_h, .kw = d.kernel_w,
                   .sh = d.stride_h, .sw = d.stride_w, .ph = d.pad_h, .pw = d.pad_w};
  MIXPREC_CHECK(g.h + 2 * g.ph >= g.kh && g.w + 2 * g.pw >= g.kw, op, ": window ", g.kh, "x",
                g.kw, " is larger than the padded input ", shape_str(x));
  MIXPREC_CHECK(y[0] == x[0] && y[1] == x[1] &&
                    g.oh == window_output_size(g.h, g.kh, g.sh, g.ph) &&
                    g.ow == window_output_size(g.w, g.kw, g.sw, g.pw),
                op, ": inconsistent shapes: input ", shape_str(x), ", output ", shape_str(y));
  // The argmax is a flat index into one plane, stored as I32.
  MIXPREC_CHECK(g.h * g.w <= INT32_MAX, op, ": input planes of ", g.h, "x", g.w,
                " elements are too large for an I32 argmax; pool smaller planes");
  return g;
}

// Elements of a batched GEMM operand that the descriptor touches.
int64_t span(int64_t batch, int64_t stride, int64_t matrix) {
  return (batch - 1) * stride + matrix;
}

const char* backend_name(Device device) { return device.is_cpu() ? "CPU" : "CUDA"; }

Conv2dGeometry conv_geometry(const char* op, const Shape& x, const Shape& w, const Shape& y,
                             const Conv2dDesc& d) {
  MIXPREC_CHECK(x.size() == 4 && w.size() == 4 && y.size() == 4, op,
                ": expected 4-D input, filter and output, got ", shape_str(x), ", ", shape_str(w),
                " and ", shape_str(y));
  MIXPREC_CHECK(d.stride_h >= 1 && d.stride_w >= 1 && d.pad_h >= 0 && d.pad_w >= 0, op,
                ": invalid stride or padding");
  Conv2dGeometry g{.n = x[0], .c = x[1], .h = x[2], .w = x[3],
                   .o = w[0], .kh = w[2], .kw = w[3],
                   .oh = y[2], .ow = y[3],
                   .sh = d.stride_h, .sw = d.stride_w, .ph = d.pad_h, .pw = d.pad_w};
  MIXPREC_CHECK(g.h + 2 * g.ph >= g.kh && g.w + 2 * g.pw >= g.kw, op, ": filter ", shape_str(w),
                " is larger than the padded input ", shape_str(x));
  MIXPREC_CHECK(w[1] == g.c && y[0] == g.n && y[1] == g.o &&
                    g.oh == window_output_size(g.h, g.kh, g.sh, g.ph) &&
                    g.ow == window_output_size(g.w, g.kw, g.sw, g.pw),
                op, ": inconsistent shapes: input ", shape_str(x), ", filter ", shape_str(w),
                ", output ", shape_str(y));
  return g;
}

// The per-channel bias of conv2d, or its gradient: `channels` elements.
void channel_bias(const char* op, const char* what, const Tensor* t, int64_t channels) {
  MIXPREC_CHECK(!t || t->numel() == channels, op, ": ", what, " ", describe(*t),
                " does not have ", channels, " elements");
}

Channels channel_layout(const char* op, const Tensor& x) {
  MIXPREC_CHECK(x.dim() >= 2, op, ": expected an input of at least 2 dimensions [N, C, ...], got ",
                describe(x));
  const int64_t n = x.size(0), c = x.size(1);
  return {n, c, n * c == 0 ? 0 : x.numel() / (n * c)};
}

// A per-channel parameter of batch norm (or its gradient) in x's dtype.
void channel_parameter(const char* op, const char* what, const Tensor& t, const Tensor& x,
                       int64_t channels) {
  MIXPREC_CHECK(t.dtype() == x.dtype() && t.numel() == channels, op, ": ", what, " ", describe(t),
                " must have ", channels, " elements of the input's dtype ", x.dtype());
}

// A per-channel F32 statistic of batch norm.
void channel_statistic(const char* op, const char* what, const Tensor& t, int64_t channels) {
  MIXPREC_CHECK(t.dtype() == DType::F32 && t.numel() == channels, op, ": ", what, " ",
                describe(t), " must be F32 [", channels, "]");
}

}  // namespace

// ---- building blocks --------------------------------------------------------------------------

void all_on_device(const char* op, Device device,
                   std::initializer_list<std::pair<const char*, const Tensor*>> operands) {
  for (const auto& [what, t] : operands)
    if (t != nullptr) on_device(op, what, *t, device);
}

void on_device(const char* op, const char* what, const Tensor& t, Device device) {
  MIXPREC_CHECK(t.defined(), op, ": ", what, " is undefined; pass a tensor on ", device);
  MIXPREC_CHECK(t.device() == device, op, ": ", what, " ", describe(t), " is not on ", device,
                "; move it there with .to(", device, ") first");
}

void same_dtype(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = *ts.begin();
  for (const Tensor* t : ts) {
    if (t == nullptr) continue;
    MIXPREC_CHECK(t->dtype() == first->dtype(), op, ": dtype mismatch between ",
                  describe(*first), " and ", describe(*t));
  }
}

void same_shape(const char* op, const Tensor& a, const Tensor& b) {
  MIXPREC_CHECK(a.shape() == b.shape(), op, ": shape mismatch between ", describe(a), " and ",
                describe(b));
}

bool broadcasts_to(const Shape& in, const Shape& out) {
  if (in.size() > out.size()) return false;
  const size_t lead = out.size() - in.size();
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i] != 1 && in[i] != out[lead + i]) return false;
  return true;
}

// ---- fills, casts, copies -----------------------------------------------------------------

void cast(Device device, const Tensor& x, const Tensor& y) {
  all_on_device("cast", device, {{"x", &x}, {"y", &y}});
  same_numel("cast", x, y);
}

void copy(Device device, const Tensor& x, const Tensor& y) {
  all_on_device("copy", device, {{"x", &x}, {"y", &y}});
  MIXPREC_CHECK(x.dtype() == y.dtype() && x.numel() == y.numel(), "copy: ", describe(x), " and ",
                describe(y), " differ");
}

namespace {

// A range of bytes a widen_gradients item names: its source or its destination.
struct WideningRange {
  uintptr_t begin = 0, end = 0;
  size_t item = 0;
  bool destination = false;
};

std::string range_name(const WideningRange& r) {
  return detail::concat(r.destination ? "the destination" : "the source", " of item ", r.item);
}

}  // namespace

void widen_gradients(Device device, const std::vector<GradientWidening>& items) {
  constexpr const char* kOp = "widen_gradients";
  std::vector<WideningRange> ranges;
  ranges.reserve(2 * items.size());
  for (size_t k = 0; k < items.size(); ++k) {
    const GradientWidening& item = items[k];
    MIXPREC_CHECK(item.source != nullptr && item.destination != nullptr, kOp, ": item ", k,
                  " lacks its ", item.source == nullptr ? "source" : "destination");
    const Tensor& source = *item.source;
    const Tensor& destination = *item.destination;
    all_on_device(kOp, device, {{"source", &source}, {"destination", &destination}});
    MIXPREC_CHECK(source.dtype() == DType::F16 || source.dtype() == DType::BF16, kOp, ": item ",
                  k, "'s source ", describe(source), " must be F16 or BF16");
    MIXPREC_CHECK(destination.dtype() == DType::F32, kOp, ": item ", k, "'s destination ",
                  describe(destination), " must be F32");
    same_shape(kOp, source, destination);
    for (const Tensor* t : {&source, &destination}) {
      if (t->numel() == 0) continue;
      const auto begin = reinterpret_cast<uintptr_t>(t->data());
      ranges.push_back({begin, begin + t->nbytes(), k, t == &destination});
    }
  }
  // One sweep in address order: a destination starting before the furthest end of any
  // earlier range overlaps it, and so does a source starting before the furthest end of an
  // earlier destination. Sources alone may overlap.
  std::sort(ranges.begin(), ranges.end(),
            [](const WideningRange& a, const WideningRange& b) { return a.begin < b.begin; });
  const WideningRange* furthest = nullptr;
  const WideningRange* furthest_destination = nullptr;
  for (const WideningRange& r : ranges) {
    const WideningRange* earlier = r.destination ? furthest : furthest_destination;
    MIXPREC_CHECK(earlier == nullptr || r.begin >= earlier->end, kOp, ": ", range_name(r),
                  " overlaps ", range_name(*earlier),
                  "; every destination must be memory of its own");
    if (furthest == nullptr || r.end > furthest->end) furthest = &r;
    if (r.destination && (furthest_destination == nullptr || r.end > furthest_destination->end))
      furthest_destination = &r;
  }
}

// ---- elementwise --------------------------------------------------------------------------

void unary(Device device, const Tensor& x, const Tensor& y) {
  all_on_device("unary", device, {{"x", &x}, {"y", &y}});
  same_dtype("unary", {&x, &y});
  same_shape("unary", x, y);
}

void unary_backward(Device device, const Tensor& x, const Tensor& y, const Tensor& dy,
                    const Tensor& dx) {
  constexpr const char* kOp = "unary_backward";
  all_on_device(kOp, device, {{"x", &x}, {"y", &y}, {"dy", &dy}, {"dx", &dx}});
  for (const Tensor* t : {&y, &dy, &dx}) {
    same_dtype(kOp, {&x, t});
    same_shape(kOp, x, *t);
  }
}

void affine(Device device, const Tensor& x, const Tensor& y) {
  all_on_device("affine", device, {{"x", &x}, {"y", &y}});
  same_dtype("affine", {&x, &y});
  same_shape("affine", x, y);
}

void binary(Device device, const Tensor& a, const Tensor& b, const Tensor& out) {
  all_on_device("binary", device, {{"a", &a}, {"b", &b}, {"out", &out}});
  same_dtype("binary", {&a, &out});
  same_dtype("binary", {&b, &out});
  MIXPREC_CHECK(broadcasts_to(a.shape(), out.shape()) && broadcasts_to(b.shape(), out.shape()),
                "binary: ", describe(a), " and ", describe(b), " do not broadcast to ",
                describe(out));
}

void sum_to(Device device, const Tensor& x, const Tensor& y) {
  all_on_device("sum_to", device, {{"x", &x}, {"y", &y}});
  same_dtype("sum_to", {&x, &y});
  MIXPREC_CHECK(broadcasts_to(y.shape(), x.shape()), "sum_to: ", describe(y),
                " does not broadcast to ", describe(x));
}

void expand(Device device, const Tensor& x, const Tensor& y) {
  all_on_device("expand", device, {{"x", &x}, {"y", &y}});
  same_dtype("expand", {&x, &y});
  MIXPREC_CHECK(broadcasts_to(x.shape(), y.shape()), "expand: ", describe(x),
                " does not broadcast to ", describe(y));
}

Rows causal_mask(Device device, const Tensor& x, const Tensor& y) {
  all_on_device("causal_mask", device, {{"x", &x}, {"y", &y}});
  same_dtype("causal_mask", {&x, &y});
  same_shape("causal_mask", x, y);
  MIXPREC_CHECK(x.dim() >= 2, "causal_mask: expected at least 2 dimensions, got ", describe(x));
  return {x.size(-2), x.size(-1)};
}

// ---- layout -----------------------------------------------------------------------------

Heads heads(const char* op, Device device, const Tensor& qkv, const Tensor& q, const Tensor& k,
            const Tensor& v) {
  all_on_device(op, device, {{"qkv", &qkv}, {"q", &q}, {"k", &k}, {"v", &v}});
  same_dtype(op, {&qkv, &q, &k, &v});
  MIXPREC_CHECK(q.dim() == 4 && k.shape() == q.shape() && v.shape() == q.shape(), op,
                ": q, k and v must share one shape [B, H, T, D], got ", describe(q), ", ",
                describe(k), " and ", describe(v));
  const Heads h{q.size(0), q.size(1), q.size(2), q.size(3)};
  MIXPREC_CHECK(qkv.shape() == Shape({h.batch, h.time, 3 * h.heads * h.dim}), op, ": qkv ",
                describe(qkv), " must be [B, T, 3 * H * D] = [", h.batch, ", ", h.time, ", ",
                3 * h.heads * h.dim, "] for heads ", describe(q));
  return h;
}

void permute(Device device, const Tensor& x, const std::vector<int64_t>& perm, const Tensor& y) {
  all_on_device("permute", device, {{"x", &x}, {"y", &y}});
  same_dtype("permute", {&x, &y});
  const int64_t rank = x.dim();
  MIXPREC_CHECK(static_cast<int64_t>(perm.size()) == rank && y.dim() == rank, "permute: ",
                describe(x), " -> ", describe(y), " needs a permutation of ", rank,
                " dimensions, got ", perm.size());
  std::vector<bool> seen(static_cast<size_t>(rank), false);
  for (int64_t i = 0; i < rank; ++i) {
    const int64_t p = perm[static_cast<size_t>(i)];
    MIXPREC_CHECK(p >= 0 && p < rank && !seen[static_cast<size_t>(p)], "permute: ",
                  shape_str(perm), " is not a permutation of the dimensions of ", describe(x));
    seen[static_cast<size_t>(p)] = true;
    MIXPREC_CHECK(y.shape()[i] == x.shape()[p], "permute: output ", describe(y),
                  " does not match ", describe(x), " permuted by ", shape_str(perm));
  }
}

void copy_narrow(Device device, const Tensor& src, int64_t dim, int64_t src_start,
                 const Tensor& dst, int64_t dst_start, int64_t length) {
  all_on_device("copy_narrow", device, {{"src", &src}, {"dst", &dst}});
  same_dtype("copy_narrow", {&src, &dst});
  const int64_t rank = src.dim();
  MIXPREC_CHECK(dst.dim() == rank && dim >= 0 && dim < rank, "copy_narrow: dimension ", dim,
                " is invalid for ", describe(src), " -> ", describe(dst));
  for (int64_t d = 0; d < rank; ++d)
    MIXPREC_CHECK(d == dim || src.shape()[d] == dst.shape()[d], "copy_narrow: ", describe(src),
                  " and ", describe(dst), " differ outside dimension ", dim);
  const int64_t src_extent = src.shape()[dim], dst_extent = dst.shape()[dim];
  MIXPREC_CHECK(length >= 0 && src_start >= 0 && src_start + length <= src_extent &&
                    dst_start >= 0 && dst_start + length <= dst_extent,
                "copy_narrow: range [", src_start, ", ", src_start + length, ") of ",
                describe(src), " -> [", dst_start, ", ", dst_start + length, ") of ",
                describe(dst), " along dimension ", dim, " is out of bounds");
}

// ---- GEMM and convolution ----------------------------------------------------------------

void gemm(Device device, const GemmDesc& d, const Tensor& a, const Tensor& b, const Tensor& c) {
  all_on_device("gemm", device, {{"A", &a}, {"B", &b}, {"C", &c}});
  MIXPREC_CHECK(is_floating(a.dtype()) && is_floating(b.dtype()) && is_floating(c.dtype()),
                "gemm: unsupported dtype among A ", describe(a), ", B ", describe(b), " and C ",
                describe(c), " on the ", backend_name(device), " backend");
  const bool wide_c = c.dtype() == DType::F32 && a.dtype() != DType::F32;
  MIXPREC_CHECK(a.dtype() == b.dtype() && (a.dtype() == c.dtype() || wide_c),
                "gemm: dtype mismatch between A ", describe(a), ", B ", describe(b), " and C ",
                describe(c), " (A and B share one dtype; C has it too, or is F32 for F16/BF16 "
                "A and B)");
  MIXPREC_CHECK(d.m >= 0 && d.n >= 0 && d.k >= 0 && d.batch >= 0, "gemm: negative size (m ", d.m,
                ", n ", d.n, ", k ", d.k, ", batch ", d.batch, ")");
  MIXPREC_CHECK(d.stride_a >= 0 && d.stride_b >= 0 && d.stride_c >= 0,
                "gemm: negative batch stride");
  if (d.batch == 0 || d.m == 0 || d.n == 0) return;
  MIXPREC_CHECK(d.batch == 1 || d.stride_c >= d.m * d.n, "gemm: batch stride of C (", d.stride_c,
                ") is below m * n = ", d.m * d.n, ", so outputs of the batch would overlap");
  MIXPREC_CHECK(span(d.batch, d.stride_a, d.m * d.k) <= a.numel(), "gemm: A ", describe(a),
                " is too small for batch ", d.batch, " of ", d.trans_a ? d.k : d.m, "x",
                d.trans_a ? d.m : d.k, " with stride ", d.stride_a);
  MIXPREC_CHECK(span(d.batch, d.stride_b, d.k * d.n) <= b.numel(), "gemm: B ", describe(b),
                " is too small for batch ", d.batch, " of ", d.trans_b ? d.n : d.k, "x",
                d.trans_b ? d.k : d.n, " with stride ", d.stride_b);
  MIXPREC_CHECK(span(d.batch, d.stride_c, d.m * d.n) <= c.numel(), "gemm: C ", describe(c),
                " is too small for batch ", d.batch, " of ", d.m, "x", d.n, " with stride ",
                d.stride_c);
}

void gemm_epilogue(Device device, const GemmDesc& d, GemmEpilogue epilogue, const Tensor& a,
                   const Tensor& b, const Tensor* bias, const Tensor& c, const Tensor* pre_gelu) {
  constexpr const char* kOp = "gemm_epilogue";
  all_on_device(kOp, device, {{"bias", bias}, {"pre_gelu", pre_gelu}});
  gemm(device, d, a, b, c);
  same_dtype(kOp, {&a, &c, bias, pre_gelu});
  MIXPREC_CHECK(d.batch == 1 && d.beta == 0.0f, kOp, ": takes one product (batch ", d.batch,
                ") with beta 0 (got ", d.beta, ")");
  MIXPREC_CHECK(epilogue_has_bias(epilogue) == (bias != nullptr), kOp, ": the bias is ",
                bias ? "only for the epilogues with a bias" : "required by this epilogue");
  MIXPREC_CHECK(!bias || (bias->dim() == 1 && bias->size(0) == d.n), kOp, ": bias ",
                describe(*bias), " must be [", d.n, "], one value per column of C");
  const bool gelu = epilogue_has_gelu(epilogue);
  MIXPREC_CHECK(gelu == (pre_gelu != nullptr), kOp, ": pre_gelu is ",
                gelu ? "required by the gelu epilogue" : "only for the gelu epilogue");
  MIXPREC_CHECK(!gelu || pre_gelu->numel() >= d.m * d.n, kOp, ": pre_gelu ",
                describe(*pre_gelu), " is too small for ", d.m, "x", d.n);
}

Conv2dGeometry conv2d(Device device, const Tensor& x, const Tensor& w, const Tensor* bias,
                      const Conv2dDesc& desc, const Tensor& y) {
  constexpr const char* kOp = "conv2d";
  all_on_device(kOp, device, {{"input", &x}, {"filter", &w}, {"output", &y}, {"bias", bias}});
  const Conv2dGeometry g = conv_geometry(kOp, x.shape(), w.shape(), y.shape(), desc);
  same_dtype(kOp, {&x, &w, bias, &y});
  channel_bias(kOp, "bias", bias, g.o);
  return g;
}

Conv2dGeometry conv2d_backward_data(Device device, const Tensor& dy, const Tensor& w,
                                    const Conv2dDesc& desc, const Tensor& dx) {
  constexpr const char* kOp = "conv2d_backward_data";
  all_on_device(kOp, device, {{"output gradient", &dy}, {"filter", &w}, {"input gradient", &dx}});
  const Conv2dGeometry g = conv_geometry(kOp, dx.shape(), w.shape(), dy.shape(), desc);
  same_dtype(kOp, {&dy, &w, &dx});
  return g;
}

Conv2dGeometry conv2d_backward_filter(Device device, const Tensor& x, const Tensor& dy,
                                      const Conv2dDesc& desc, const Tensor& dw,
                                      const Tensor* dbias) {
  constexpr const char* kOp = "conv2d_backward_filter";
  all_on_device(kOp, device, {{"input", &x}, {"output gradient", &dy}, {"filter gradient", &dw},
                              {"bias gradient", dbias}});
  const Conv2dGeometry g = conv_geometry(kOp, x.shape(), dw.shape(), dy.shape(), desc);
  same_dtype(kOp, {&x, &dy, &dw, dbias});
  channel_bias(kOp, "dbias", dbias, g.o);
  return g;
}

// ---- neural-network primitives ----------------------------------------------------------

Rows softmax(Device device, const Tensor& x, const Tensor& y) {
  all_on_device("softmax", device, {{"x", &x}, {"y", &y}});
  same_numel("softmax", x, y);
  MIXPREC_CHECK(y.dtype() == x.dtype(), "softmax: output ", describe(y), " must be ", x.dtype());
  return last_dim_rows(x);
}

Rows softmax_backward(Device device, const Tensor& y, const Tensor& dy, const Tensor& dx) {
  all_on_device("softmax_backward", device, {{"y", &y}, {"dy", &dy}, {"dx", &dx}});
  MIXPREC_CHECK(y.dtype() == dy.dtype() && y.dtype() == dx.dtype() && y.numel() == dy.numel() &&
                    y.numel() == dx.numel(),
                "softmax_backward: y ", describe(y), ", dy ", describe(dy), " and dx ",
                describe(dx), " must match");
  return last_dim_rows(y);
}

Rows attention_softmax(Device device, const Tensor& scores, float p, const Tensor& probs,
                       const Tensor& operand) {
  constexpr const char* kOp = "attention_softmax";
  all_on_device(kOp, device, {{"scores", &scores}, {"probs", &probs}, {"operand", &operand}});
  MIXPREC_CHECK(scores.dtype() == DType::F32 && probs.dtype() == DType::F32 && scores.dim() >= 2,
                kOp, ": scores ", describe(scores), " and probs ", describe(probs),
                " must be F32 with at least 2 dimensions");
  MIXPREC_CHECK(is_floating(operand.dtype()), kOp, ": operand ", describe(operand),
                " must be floating");
  same_shape(kOp, scores, probs);
  same_shape(kOp, scores, operand);
  MIXPREC_CHECK(p >= 0.0f && p < 1.0f, kOp, ": dropout p must be in [0, 1), got ", p);
  const bool operand_shares = operand.numel() > 0 && (operand.data() == probs.data() ||
                                                      operand.data() == scores.data());
  MIXPREC_CHECK(!operand_shares || (operand.dtype() == DType::F32 && p == 0.0f), kOp,
                ": operand may share memory with the scores or probs only when it is F32 and "
                "p is 0 (it then holds probs' values), got ", operand.dtype(), " and p = ", p);
  return {scores.size(-2), scores.size(-1)};
}

Rows attention_softmax_backward(Device device, const Tensor& probs, const Tensor& dprobs, float p,
                                const Tensor& ds) {
  constexpr const char* kOp = "attention_softmax_backward";
  all_on_device(kOp, device, {{"probs", &probs}, {"dprobs", &dprobs}, {"ds", &ds}});
  MIXPREC_CHECK(probs.dtype() == DType::F32 && dprobs.dtype() == DType::F32 && probs.dim() >= 1,
                kOp, ": probs ", describe(probs), " and dprobs ", describe(dprobs),
                " must be F32 with at least 1 dimension");
  MIXPREC_CHECK(is_floating(ds.dtype()), kOp, ": ds ", describe(ds), " must be floating");
  same_shape(kOp, probs, dprobs);
  same_shape(kOp, probs, ds);
  MIXPREC_CHECK(p >= 0.0f && p < 1.0f, kOp, ": dropout p must be in [0, 1), got ", p);
  const bool ds_shares =
      ds.numel() > 0 && (ds.data() == probs.data() || ds.data() == dprobs.data());
  MIXPREC_CHECK(!ds_shares || ds.dtype() == DType::F32, kOp,
                ": ds may share memory with probs or dprobs only when it is F32, got ", ds.dtype());
  return last_dim_rows(probs);
}

Rows cross_entropy(Device device, const Tensor& logits, const Tensor& labels, const Tensor& loss,
                   const Tensor& row_stats) {
  constexpr const char* kOp = "cross_entropy";
  all_on_device(kOp, device, {{"logits", &logits}, {"labels", &labels}, {"loss", &loss},
                              {"row statistics", &row_stats}});
  const Rows r = logits_rows(kOp, logits, labels);
  MIXPREC_CHECK(loss.dtype() == DType::F32 && loss.numel() == 1 &&
                    row_stats.dtype() == DType::F32 && row_stats.numel() == 2 * r.rows,
                "cross_entropy: loss ", describe(loss), " and row statistics ",
                describe(row_stats), " must be F32 (a scalar and [", r.rows, ", 2])");
  return r;
}

Rows cross_entropy_backward(Device device, const Tensor& logits, const Tensor& labels,
                            const Tensor& row_stats, const Tensor& dloss, const Tensor& dlogits) {
  constexpr const char* kOp = "cross_entropy_backward";
  all_on_device(kOp, device, {{"logits", &logits}, {"labels", &labels},
                              {"row statistics", &row_stats}, {"dloss", &dloss},
                              {"dlogits", &dlogits}});
  const Rows r = logits_rows(kOp, logits, labels);
  MIXPREC_CHECK(row_stats.dtype() == DType::F32 && row_stats.numel() == 2 * r.rows &&
                    dloss.dtype() == DType::F32 && dloss.numel() == 1,
                "cross_entropy_backward: row statistics ", describe(row_stats), " and dloss ",
                describe(dloss), " must be F32 ([", r.rows, ", 2] and a scalar)");
  MIXPREC_CHECK(dlogits.dtype() == logits.dtype() && dlogits.numel() == logits.numel(),
                "cross_entropy_backward: dlogits ", describe(dlogits), " must match logits ",
                describe(logits));
  return r;
}

Rows layer_norm(Device device, const Tensor& x, const Tensor* weight, const Tensor* bias,
                const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  constexpr const char* kOp = "layer_norm";
  all_on_device(kOp, device, {{"x", &x}, {"weight", weight}, {"bias", bias}, {"y", &y},
                              {"mean", &mean}, {"rstd", &rstd}});
  MIXPREC_CHECK(x.dim() >= 1, kOp, ": expected at least one dimension, got ", describe(x));
  const Rows r = last_dim_rows(x);
  MIXPREC_CHECK(y.dtype() == x.dtype() && y.numel() == x.numel(), kOp, ": output ", describe(y),
                " must match the input ", describe(x));
  column_parameter(kOp, "weight", weight, x, r.cols);
  column_parameter(kOp, "bias", bias, x, r.cols);
  row_statistics(kOp, mean, rstd, r.rows);
  return r;
}

Rows layer_norm_backward(Device device, const Tensor& x, const Tensor* weight,
                         const Tensor& mean, const Tensor& rstd, const Tensor& dy,
                         const Tensor& dx, const Tensor* dweight, const Tensor* dbias) {
  constexpr const char* kOp = "layer_norm_backward";
  all_on_device(kOp, device, {{"x", &x}, {"weight", weight}, {"mean", &mean}, {"rstd", &rstd},
                              {"dy", &dy}, {"dx", &dx}, {"dweight", dweight}, {"dbias", dbias}});
  MIXPREC_CHECK(x.dim() >= 1, kOp, ": expected at least one dimension, got ", describe(x));
  const Rows r = last_dim_rows(x);
  MIXPREC_CHECK(dy.dtype() == x.dtype() && dy.numel() == x.numel() && dx.dtype() == x.dtype() &&
                    dx.numel() == x.numel(),
                kOp, ": dy ", describe(dy), " and dx ", describe(dx), " must match the input ",
                describe(x));
  column_parameter(kOp, "weight", weight, x, r.cols);
  column_parameter(kOp, "dweight", dweight, x, r.cols);
  column_parameter(kOp, "dbias", dbias, x, r.cols);
  row_statistics(kOp, mean, rstd, r.rows);
  return r;
}

Rows embedding(Device device, const Tensor& weight, const Tensor& ids, const Tensor& y) {
  all_on_device("embedding", device, {{"weight", &weight}, {"ids", &ids}, {"y", &y}});
  MIXPREC_CHECK(weight.dim() == 2 && ids.dtype() == DType::I32, "embedding: weight ",
                describe(weight), " must be [V, D] and ids ", describe(ids), " I32");
  const Rows r{ids.numel(), weight.size(1)};
  MIXPREC_CHECK(y.dtype() == weight.dtype() && y.numel() == r.rows * r.cols, "embedding: output ",
                describe(y), " does not match ", r.rows, " ids of ", describe(weight));
  return r;
}

Rows embedding_backward(Device device, const Tensor& ids, const Tensor& dy,
                        const Tensor& dweight) {
  all_on_device("embedding_backward", device, {{"ids", &ids}, {"dy", &dy}, {"dweight", &dweight}});
  MIXPREC_CHECK(dweight.dim() == 2 && ids.dtype() == DType::I32, "embedding_backward: dweight ",
                describe(dweight), " must be [V, D] and ids ", describe(ids), " I32");
  const Rows r{ids.numel(), dweight.size(1)};
  MIXPREC_CHECK(dy.dtype() == dweight.dtype() && dy.numel() == r.rows * r.cols,
                "embedding_backward: dy ", describe(dy), " does not match ", r.rows,
                " ids and dweight ", describe(dweight));
  return r;
}

void dropout(Device device, const Tensor& x, float p, const Tensor& y) {
  all_on_device("dropout", device, {{"x", &x}, {"y", &y}});
  MIXPREC_CHECK(x.dtype() == y.dtype() && x.numel() == y.numel(), "dropout: ", describe(x),
                " and ", describe(y), " differ");
  MIXPREC_CHECK(p >= 0.0f && p < 1.0f, "dropout: p must be in [0, 1), got ", p);
}

void dropout_add(Device device, const Tensor& residual, const Tensor& x, float p,
                 const Tensor& y) {
  constexpr const char* kOp = "dropout_add";
  all_on_device(kOp, device, {{"residual", &residual}, {"x", &x}, {"y", &y}});
  same_dtype(kOp, {&residual, &x, &y});
  same_shape(kOp, residual, x);
  same_shape(kOp, x, y);
  MIXPREC_CHECK(p >= 0.0f && p < 1.0f, "dropout_add: p must be in [0, 1), got ", p);
}

Channels batch_norm(Device device, const Tensor& x, const Tensor& weight, const Tensor& bias,
                    const Tensor& running_mean, const Tensor& running_var, bool training,
                    const Tensor& y, const Tensor& save_mean, const Tensor& save_invstd) {
  constexpr const char* kOp = "batch_norm";
  all_on_device(kOp, device, {{"input", &x}, {"weight", &weight}, {"bias", &bias},
                              {"running_mean", &running_mean}, {"running_var", &running_var},
                              {"output", &y}, {"save_mean", &save_mean},
                              {"save_invstd", &save_invstd}});
  const Channels l = channel_layout(kOp, x);
  MIXPREC_CHECK(y.dtype() == x.dtype() && y.shape() == x.shape(), kOp, ": output ", describe(y),
                " must have the input's shape and dtype ", describe(x));
  channel_parameter(kOp, "weight", weight, x, l.c);
  channel_parameter(kOp, "bias", bias, x, l.c);
  channel_statistic(kOp, "running_mean", running_mean, l.c);
  channel_statistic(kOp, "running_var", running_var, l.c);
  channel_statistic(kOp, "save_mean", save_mean, l.c);
  channel_statistic(kOp, "save_invstd", save_invstd, l.c);
  MIXPREC_CHECK(!training || l.count() > 1, "batch_norm: training needs more than one value per "
                "channel, got ", describe(x));
  return l;
}

Channels batch_norm_backward(Device device, const Tensor& x, const Tensor& weight,
                             const Tensor& save_mean, const Tensor& save_invstd,
                             const Tensor& dy, const Tensor* relu_bias, const Tensor& dx,
                             const Tensor& dweight, const Tensor& dbias) {
  constexpr const char* kOp = "batch_norm_backward";
  all_on_device(kOp, device, {{"input", &x}, {"weight", &weight}, {"save_mean", &save_mean},
                              {"save_invstd", &save_invstd}, {"output gradient", &dy},
                              {"relu bias", relu_bias}, {"input gradient", &dx},
                              {"weight gradient", &dweight}, {"bias gradient", &dbias}});
  const Channels l = channel_layout(kOp, x);
  for (const Tensor* t : {&dy, &dx}) {
    MIXPREC_CHECK(t->dtype() == x.dtype() && t->shape() == x.shape(), kOp, ": ", describe(*t),
                  " must have the input's shape and dtype ", describe(x));
  }
  channel_parameter(kOp, "weight", weight, x, l.c);
  if (relu_bias) channel_parameter(kOp, "relu bias", *relu_bias, x, l.c);
  channel_parameter(kOp, "weight gradient", dweight, x, l.c);
  channel_parameter(kOp, "bias gradient", dbias, x, l.c);
  channel_statistic(kOp, "save_mean", save_mean, l.c);
  channel_statistic(kOp, "save_invstd", save_invstd, l.c);
  return l;
}

Pool2dGeometry pool2d(Device device, const Pool2dDesc& desc, const Tensor& x, const Tensor& y,
                      const Tensor* argmax) {
  all_on_device("pool2d", device, {{"x", &x}, {"y", &y}, {"argmax", argmax}});
  const Pool2dGeometry g = pool_geometry("pool2d", desc, x.shape(), y.shape());
  same_dtype("pool2d", {&x, &y});
  if (desc.kind == PoolKind::Max && argmax) {
    MIXPREC_CHECK(argmax->dtype() == DType::I32 && argmax->shape() == y.shape(), "pool2d: argmax ",
                  describe(*argmax), " must be I32 of the output's shape ", shape_str(y.shape()));
  }
  return g;
}

Pool2dGeometry pool2d_backward(Device device, const Pool2dDesc& desc, const Tensor& dy,
                               const Tensor* argmax, const Tensor& dx) {
  all_on_device("pool2d_backward", device, {{"dy", &dy}, {"argmax", argmax}, {"dx", &dx}});
  const Pool2dGeometry g = pool_geometry("pool2d_backward", desc, dx.shape(), dy.shape());
  same_dtype("pool2d_backward", {&dy, &dx});
  if (desc.kind == PoolKind::Max) {
    MIXPREC_CHECK(argmax && argmax->dtype() == DType::I32 && argmax->shape() == dy.shape(),
                  "pool2d_backward: max pooling needs the I32 argmax of the forward, shaped ",
                  shape_str(dy.shape()));
  }
  return g;
}

}  // namespace mixprec::backend_checks
