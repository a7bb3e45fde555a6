// Batch normalisation of the CUDA backend: own kernels (cuda/kernels/batch_norm.h) rather than
// cuDNN's cudnnBatchNormalization*. The kernels compute exactly the CPU backend's formulae
// (core/math/norm.h: double channel sums, biased variance from centred squares, PyTorch's
// momentum and unbiased running variance, save_invstd = 1 / sqrt(var + eps)) in an order fixed
// by the shape. cuDNN would need the weight and bias converted to F32 for 16-bit inputs,
// documents neither its accumulation type nor its summation order, and its fastest
// (persistent) mode is not guaranteed to be deterministic; the statistics could then differ
// from the CPU oracle by more than a rounding and from one run to the next.
#include <initializer_list>

#include "core/error.h"
#include "core/tensor.h"
#include "cuda/cuda_backend.h"
#include "cuda/kernels/batch_norm.h"

namespace mixprec {
namespace {

kernels::BatchNormLayout channel_layout(const char* op, const Tensor& x) {
  MIXPREC_CHECK(x.dim() >= 2, op, ": expected an input of at least 2 dimensions [N, C, ...], got ",
                describe(x));
  MIXPREC_CHECK(is_floating(x.dtype()), op, ": unsupported dtype ", x.dtype(),
                " on the CUDA backend; batch norm takes F32, F16 or BF16");
  const int64_t n = x.size(0), c = x.size(1);
  return {n, c, n * c == 0 ? 0 : x.numel() / (n * c)};
}

// A per-channel parameter in x's dtype.
void check_parameter(const char* op, const char* what, const Tensor& t, const Tensor& x,
                     int64_t channels) {
  MIXPREC_CHECK(t.dtype() == x.dtype() && t.numel() == channels, op, ": ", what, " ", describe(t),
                " must have ", channels, " elements of the input's dtype ", x.dtype());
}

// A per-channel F32 statistic.
void check_statistic(const char* op, const char* what, const Tensor& t, int64_t channels) {
  MIXPREC_CHECK(t.dtype() == DType::F32 && t.numel() == channels, op, ": ", what, " ",
                describe(t), " must be F32 [", channels, "]");
}

}  // namespace

void CudaBackend::batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                             Tensor& running_mean, Tensor& running_var, bool training,
                             float momentum, float eps, Tensor& y, Tensor& save_mean,
                             Tensor& save_invstd) {
  constexpr const char* kOp = "batch_norm";
  check_here(kOp, "input", x);
  check_here(kOp, "weight", weight);
  check_here(kOp, "bias", bias);
  check_here(kOp, "running_mean", running_mean);
  check_here(kOp, "running_var", running_var);
  check_here(kOp, "output", y);
  check_here(kOp, "save_mean", save_mean);
  check_here(kOp, "save_invstd", save_invstd);
  const kernels::BatchNormLayout l = channel_layout(kOp, x);
  MIXPREC_CHECK(y.dtype() == x.dtype() && y.shape() == x.shape(), kOp, ": output ", describe(y),
                " must have the input's shape and dtype ", describe(x));
  check_parameter(kOp, "weight", weight, x, l.c);
  check_parameter(kOp, "bias", bias, x, l.c);
  check_statistic(kOp, "running_mean", running_mean, l.c);
  check_statistic(kOp, "running_var", running_var, l.c);
  check_statistic(kOp, "save_mean", save_mean, l.c);
  check_statistic(kOp, "save_invstd", save_invstd, l.c);
  MIXPREC_CHECK(!training || l.count() > 1, "batch_norm: training needs more than one value per "
                "channel, got ", describe(x));
  if (l.c == 0) return;
  use_device();
  Scratch scratch(allocator_, kernels::batch_norm_scratch_bytes(l));
  kernels::batch_norm_forward(x.dtype(), l, x.data(), weight.data(), bias.data(),
                              running_mean.data_as<float>(), running_var.data_as<float>(), training,
                              momentum, eps, y.data(), save_mean.data_as<float>(),
                              save_invstd.data_as<float>(), scratch.get(), stream_);
}

void CudaBackend::batch_norm_backward(const Tensor& x, const Tensor& weight,
                                      const Tensor& save_mean, const Tensor& save_invstd,
                                      const Tensor& dy, bool training, Tensor& dx,
                                      Tensor& dweight, Tensor& dbias) {
  constexpr const char* kOp = "batch_norm_backward";
  check_here(kOp, "input", x);
  check_here(kOp, "weight", weight);
  check_here(kOp, "save_mean", save_mean);
  check_here(kOp, "save_invstd", save_invstd);
  check_here(kOp, "output gradient", dy);
  check_here(kOp, "input gradient", dx);
  check_here(kOp, "weight gradient", dweight);
  check_here(kOp, "bias gradient", dbias);
  const kernels::BatchNormLayout l = channel_layout(kOp, x);
  for (const Tensor* t : std::initializer_list<const Tensor*>{&dy, &dx}) {
    MIXPREC_CHECK(t->dtype() == x.dtype() && t->shape() == x.shape(), kOp, ": ", describe(*t),
                  " must have the input's shape and dtype ", describe(x));
  }
  check_parameter(kOp, "weight", weight, x, l.c);
  check_parameter(kOp, "weight gradient", dweight, x, l.c);
  check_parameter(kOp, "bias gradient", dbias, x, l.c);
  check_statistic(kOp, "save_mean", save_mean, l.c);
  check_statistic(kOp, "save_invstd", save_invstd, l.c);
  if (l.c == 0) return;
  use_device();
  Scratch scratch(allocator_, kernels::batch_norm_scratch_bytes(l));
  kernels::batch_norm_backward(x.dtype(), l, x.data(), weight.data(), save_mean.data_as<float>(),
                               save_invstd.data_as<float>(), dy.data(), training, dx.data(),
                               dweight.data(), dbias.data(), scratch.get(), stream_);
}

}  // namespace mixprec
