// Layout and neural-network primitives of the CUDA backend: permute, copy_narrow, attention's
// q/k/v heads split and merge, softmax (and attention's fused softmax), cross-entropy, layer
// norm, embedding, dropout and pooling. Validation is core/backend_checks.h's (the CPU
// backend's too); the kernels are cuda/kernels/layout.cu, softmax.cu, layer_norm.cu,
// embedding.cu, dropout.cu and pool.cu. None of them waits for the device: values the host
// would need (the loss scale dloss, the labels) stay on the device.
#include <cstdint>
#include <vector>

#include "core/backend_checks.h"
#include "core/math/broadcast.h"
#include "core/tensor.h"
#include "cuda/cuda_backend.h"
#include "cuda/kernels/dropout.h"
#include "cuda/kernels/embedding.h"
#include "cuda/kernels/layer_norm.h"
#include "cuda/kernels/layout.h"
#include "cuda/kernels/pool.h"
#include "cuda/kernels/softmax.h"

namespace mixprec {
namespace {

const void* data_or_null(const Tensor* t) { return t != nullptr ? t->data() : nullptr; }
void* data_or_null(Tensor* t) { return t != nullptr ? t->data() : nullptr; }

}  // namespace

// ---- layout -------------------------------------------------------------------------------------

void CudaBackend::permute(const Tensor& x, const std::vector<int64_t>& perm, Tensor& y) {
  backend_checks::permute(device(), x, perm, y);
  if (x.numel() == 0) return;
  use_device();
  kernels::permute(plan_permute(x.shape(), perm), dtype_size(x.dtype()), x.data(), y.data(),
                   x.numel(), stream_);
}

void CudaBackend::copy_narrow(const Tensor& src, int64_t dim, int64_t src_start, Tensor& dst,
                              int64_t dst_start, int64_t length) {
  backend_checks::copy_narrow(device(), src, dim, src_start, dst, dst_start, length);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= src.shape()[d];
  for (int64_t d = dim + 1; d < src.dim(); ++d) inner *= src.shape()[d];
  if (outer * inner * length == 0) return;
  // Each of the `outer` slices is one contiguous run of length * inner elements in both.
  const size_t esize = dtype_size(src.dtype());
  const size_t slice = static_cast<size_t>(inner) * esize;
  use_device();
  kernels::copy_rows(static_cast<const char*>(src.data()) + src_start * slice,
                     src.shape()[dim] * slice, nullptr,
                     static_cast<char*>(dst.data()) + dst_start * slice,
                     dst.shape()[dim] * slice, length * slice, outer, stream_);
}

void CudaBackend::split_heads(const Tensor& qkv, Tensor& q, Tensor& k, Tensor& v) {
  const backend_checks::Heads h = backend_checks::heads("split_heads", device(), qkv, q, k, v);
  if (q.numel() == 0) return;
  use_device();
  void* const parts[3] = {q.data(), k.data(), v.data()};
  kernels::split_heads(qkv.data(), parts, h.batch, h.time, h.heads,
                       static_cast<size_t>(h.dim) * dtype_size(qkv.dtype()), stream_);
}

void CudaBackend::merge_heads(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& qkv) {
  const backend_checks::Heads h = backend_checks::heads("merge_heads", device(), qkv, q, k, v);
  if (q.numel() == 0) return;
  use_device();
  const void* const parts[3] = {q.data(), k.data(), v.data()};
  kernels::merge_heads(parts, qkv.data(), h.batch, h.time, h.heads,
                       static_cast<size_t>(h.dim) * dtype_size(qkv.dtype()), stream_);
}

// ---- softmax and cross-entropy ------------------------------------------------------------------

void CudaBackend::softmax(const Tensor& x, Tensor& y, bool log) {
  const backend_checks::Rows r = backend_checks::softmax(device(), x, y);
  if (r.rows == 0) return;
  use_device();
  kernels::softmax(x.dtype(), x.data(), y.data(), r.rows, r.cols, log, stream_);
}

void CudaBackend::attention_softmax(const Tensor& scores, float p, PhiloxKey key, Tensor& probs,
                                    Tensor& operand) {
  const backend_checks::Rows r =
      backend_checks::attention_softmax(device(), scores, p, probs, operand);
  if (scores.numel() == 0) return;
  use_device();
  kernels::attention_softmax(operand.dtype(), scores.data_as<float>(), p, mask_key(key, p),
                             probs.data_as<float>(), operand.data(), scores.numel() / r.cols,
                             r.rows, r.cols, stream_);
}

void CudaBackend::attention_softmax_backward(const Tensor& probs, const Tensor& dprobs, float p,
                                             PhiloxKey key, Tensor& ds) {
  const backend_checks::Rows r =
      backend_checks::attention_softmax_backward(device(), probs, dprobs, p, ds);
  if (r.rows == 0) return;
  use_device();
  kernels::attention_softmax_backward(ds.dtype(), probs.data_as<float>(),
                                      dprobs.data_as<float>(), p, mask_key(key, p), ds.data(),
                                      r.rows, r.cols, stream_);
}

void CudaBackend::softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx, bool log) {
  const backend_checks::Rows r = backend_checks::softmax_backward(device(), y, dy, dx);
  if (r.rows == 0) return;
  use_device();
  kernels::softmax_backward(y.dtype(), y.data(), dy.data(), dx.data(), r.rows, r.cols, log,
                            stream_);
}

void CudaBackend::cross_entropy(const Tensor& logits, const Tensor& labels, Tensor& loss,
                                Tensor& row_stats) {
  const backend_checks::Rows r =
      backend_checks::cross_entropy(device(), logits, labels, loss, row_stats);
  use_device();
  Scratch row_loss(allocator_, kernels::cross_entropy_scratch_doubles(r.rows) * sizeof(double));
  kernels::cross_entropy(logits.dtype(), logits.data(), labels.data_as<int32_t>(), r.rows,
                         r.cols, loss.data_as<float>(), row_stats.data_as<float>(),
                         static_cast<double*>(row_loss.get()), stream_);
}

void CudaBackend::cross_entropy_backward(const Tensor& logits, const Tensor& labels,
                                         const Tensor& row_stats, const Tensor& dloss,
                                         Tensor& dlogits) {
  const backend_checks::Rows r =
      backend_checks::cross_entropy_backward(device(), logits, labels, row_stats, dloss, dlogits);
  use_device();
  kernels::cross_entropy_backward(logits.dtype(), logits.data(), labels.data_as<int32_t>(),
                                  row_stats.data_as<float>(), dloss.data_as<float>(),
                                  dlogits.data(), r.rows, r.cols, stream_);
}

// ---- layer norm ---------------------------------------------------------------------------------

void CudaBackend::layer_norm(const Tensor& x, const Tensor* weight, const Tensor* bias, float eps,
                             Tensor& y, Tensor& mean, Tensor& rstd) {
  const backend_checks::Rows r =
      backend_checks::layer_norm(device(), x, weight, bias, y, mean, rstd);
  if (r.rows == 0) return;
  use_device();
  kernels::layer_norm(x.dtype(), x.data(), data_or_null(weight), data_or_null(bias), eps,
                      y.data(), mean.data_as<float>(), rstd.data_as<float>(), r.rows, r.cols,
                      stream_);
}

void CudaBackend::layer_norm_backward(const Tensor& x, const Tensor* weight, const Tensor& mean,
                                      const Tensor& rstd, const Tensor& dy, Tensor& dx,
                                      Tensor* dweight, Tensor* dbias) {
  const backend_checks::Rows r = backend_checks::layer_norm_backward(
      device(), x, weight, mean, rstd, dy, dx, dweight, dbias);
  if (r.rows == 0) {
    if (dweight != nullptr) fill(*dweight, 0.0);
    if (dbias != nullptr) fill(*dbias, 0.0);
    return;
  }
  use_device();
  const size_t floats = (dweight != nullptr || dbias != nullptr)
                            ? kernels::layer_norm_backward_scratch_floats(r.rows, r.cols)
                            : 0;
  Scratch partial(allocator_, floats * sizeof(float));
  kernels::layer_norm_backward(x.dtype(), x.data(), data_or_null(weight), mean.data_as<float>(),
                               rstd.data_as<float>(), dy.data(), dx.data(),
                               data_or_null(dweight), data_or_null(dbias), r.rows, r.cols,
                               floats > 0 ? static_cast<float*>(partial.get()) : nullptr,
                               stream_);
}

// ---- embedding and dropout --------------------------------------------------------------------

void CudaBackend::embedding(const Tensor& weight, const Tensor& ids, Tensor& y) {
  const backend_checks::Rows r = backend_checks::embedding(device(), weight, ids, y);
  if (r.rows == 0 || r.cols == 0) return;
  const size_t row_bytes = static_cast<size_t>(r.cols) * dtype_size(weight.dtype());
  use_device();
  kernels::copy_rows(weight.data(), row_bytes, ids.data_as<int32_t>(), y.data(), row_bytes,
                     row_bytes, r.rows, stream_);
}

void CudaBackend::embedding_backward(const Tensor& ids, const Tensor& dy, Tensor& dweight) {
  const backend_checks::Rows r = backend_checks::embedding_backward(device(), ids, dy, dweight);
  const int64_t vocab = dweight.size(0);
  if (vocab == 0 || r.cols == 0) return;
  use_device();
  const size_t bytes = kernels::embedding_backward_scratch_bytes(r.rows, vocab, r.cols);
  Scratch scratch(allocator_, bytes);
  kernels::embedding_backward(dweight.dtype(), ids.data_as<int32_t>(), r.rows, dy.data(),
                              dweight.data(), vocab, r.cols, scratch.get(), bytes, stream_);
}

void CudaBackend::dropout(const Tensor& x, float p, PhiloxKey key, Tensor& y) {
  backend_checks::dropout(device(), x, p, y);
  if (x.numel() == 0) return;
  use_device();
  kernels::dropout(x.dtype(), x.data(), nullptr, p, mask_key(key, p), y.data(), x.numel(),
                   stream_);
}

void CudaBackend::dropout_add(const Tensor& residual, const Tensor& x, float p, PhiloxKey key,
                              Tensor& y) {
  backend_checks::dropout_add(device(), residual, x, p, y);
  if (x.numel() == 0) return;
  use_device();
  kernels::dropout(x.dtype(), x.data(), residual.data(), p, mask_key(key, p), y.data(),
                   x.numel(), stream_);
}

// ---- pooling ------------------------------------------------------------------------------------

void CudaBackend::pool2d(const Pool2dDesc& desc, const Tensor& x, Tensor& y, Tensor* argmax) {
  const Pool2dGeometry g = backend_checks::pool2d(device(), desc, x, y, argmax);
  if (y.numel() == 0) return;
  use_device();
  int32_t* indices =
      desc.kind == PoolKind::Max && argmax != nullptr ? argmax->data_as<int32_t>() : nullptr;
  kernels::pool2d(desc.kind, x.dtype(), g, x.data(), y.data(), indices, stream_);
}

void CudaBackend::pool2d_backward(const Pool2dDesc& desc, const Tensor& dy, const Tensor* argmax,
                                  Tensor& dx) {
  const Pool2dGeometry g = backend_checks::pool2d_backward(device(), desc, dy, argmax, dx);
  if (dx.numel() == 0) return;
  use_device();
  const int32_t* indices = desc.kind == PoolKind::Max ? argmax->data_as<int32_t>() : nullptr;
  kernels::pool2d_backward(desc.kind, dx.dtype(), g, dy.data(), indices, dx.data(), stream_);
}

}  // namespace mixprec
