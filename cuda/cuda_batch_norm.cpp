// Batch normalisation of the CUDA backend: own kernels (cuda/kernels/batch_norm.h) rather than
// cuDNN's cudnnBatchNormalization*. The kernels compute exactly the CPU backend's formulae
// (core/math/norm.h: double channel sums, biased variance from centred squares, PyTorch's
// momentum and unbiased running variance, save_invstd = 1 / sqrt(var + eps)) in an order fixed
// by the shape. cuDNN would need the weight and bias converted to F32 for 16-bit inputs,
// documents neither its accumulation type nor its summation order, and its fastest
// (persistent) mode is not guaranteed to be deterministic; the statistics could then differ
// from the CPU oracle by more than a rounding and from one run to the next.
#include "core/backend_checks.h"
#include "core/error.h"
#include "core/tensor.h"
#include "cuda/cuda_backend.h"
#include "cuda/kernels/batch_norm.h"

namespace mixprec {
namespace {

// The kernels' view of x, whose dtype must be F32, F16 or BF16 (refused before any device
// work).
kernels::BatchNormLayout kernel_layout(const char* op, const Tensor& x,
                                       const backend_checks::Channels& l) {
  MIXPREC_CHECK(is_floating(x.dtype()), op, ": unsupported dtype ", x.dtype(),
                " on the CUDA backend; batch norm takes F32, F16 or BF16");
  return {l.n, l.c, l.inner};
}

}  // namespace

void CudaBackend::batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                             Tensor& running_mean, Tensor& running_var, bool training,
                             float momentum, float eps, bool relu, Tensor& y, Tensor& save_mean,
                             Tensor& save_invstd) {
  const backend_checks::Channels channels = backend_checks::batch_norm(
      device(), x, weight, bias, running_mean, running_var, training, y, save_mean, save_invstd);
  const kernels::BatchNormLayout l = kernel_layout("batch_norm", x, channels);
  if (l.c == 0) return;
  use_device();
  Scratch scratch(allocator_, kernels::batch_norm_scratch_bytes(l));
  kernels::batch_norm_forward(x.dtype(), l, x.data(), weight.data(), bias.data(),
                              running_mean.data_as<float>(), running_var.data_as<float>(), training,
                              momentum, eps, relu, y.data(), save_mean.data_as<float>(),
                              save_invstd.data_as<float>(), scratch.get(), stream_);
}

void CudaBackend::batch_norm_backward(const Tensor& x, const Tensor& weight,
                                      const Tensor& save_mean, const Tensor& save_invstd,
                                      const Tensor& dy, bool training, const Tensor* relu_bias,
                                      Tensor& dx, Tensor& dweight, Tensor& dbias) {
  const backend_checks::Channels channels = backend_checks::batch_norm_backward(
      device(), x, weight, save_mean, save_invstd, dy, relu_bias, dx, dweight, dbias);
  const kernels::BatchNormLayout l = kernel_layout("batch_norm_backward", x, channels);
  if (l.c == 0) return;
  use_device();
  Scratch scratch(allocator_, kernels::batch_norm_scratch_bytes(l));
  kernels::batch_norm_backward(x.dtype(), l, x.data(), weight.data(), save_mean.data_as<float>(),
                               save_invstd.data_as<float>(), dy.data(), training,
                               relu_bias ? relu_bias->data() : nullptr, dx.data(),
                               dweight.data(), dbias.data(), scratch.get(), stream_);
}

}  // namespace mixprec
