// Mixed-precision primitives of the CPU backend: the fused unscale-and-check of an
// optimizer's gradients, per-tensor sums of squares (gradient clipping) and the fused SGD
// step. The per-element math is core/math/amp.h, shared with the CUDA backend; this file adds
// validation, loops and the rounding on store.
//
// Every loop is either elementwise or reduces in fixed-size blocks whose partial sums are
// added in index order, so no result depends on the OpenMP thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "core/cpu/blocks.h"
#include "core/cpu/common.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/dispatch.h"
#include "core/error.h"
#include "core/half.h"
#include "core/math/amp.h"
#include "core/tensor.h"

namespace mixprec {
namespace {

using cpu::kParallelWork;
using cpu::kParallelWorkCheap;

// Elements per FP32 scratch block.
constexpr int64_t kBlock = 512;
// Elements per partial sum of squares; the partials of one tensor are added in order.
constexpr int64_t kReduceChunk = int64_t{1} << 13;
// Elements per block inside one partial sum (see sum_squares_run).
constexpr int64_t kRunBlock = 256;

void check_on_cpu(const char* op, const char* what, const Tensor& t) {
  MIXPREC_CHECK(t.device().is_cpu(), op, ": ", what, " ", describe(t),
                " is not on the CPU; pass tensors that live on the backend's device");
}

// `t` is an F32 flag tensor of one element: the shared found_inf of the amp primitives.
void check_found_inf(const char* op, const Tensor& t) {
  MIXPREC_CHECK(t.defined(), op, ": found_inf is undefined; pass an F32 [1] tensor");
  check_on_cpu(op, "found_inf", t);
  MIXPREC_CHECK(t.dtype() == DType::F32 && t.numel() == 1, op, ": found_inf must be F32 [1], got ",
                describe(t));
}

// ---- unscale ---------------------------------------------------------------------------

// The narrowing of the unscaled product. The contract is one rounding of unscale_value's
// double to the gradient's dtype. double -> float -> F16/BF16 with round-to-nearest in
// both steps could round twice (a float result landing exactly on a 16-bit midpoint), so
// the first step rounds to odd instead: truncate toward zero and set the last bit when
// inexact. A float has at least two more significand bits than F16 or BF16 in every binade
// those can reach, and with that margin round-to-odd followed by round-to-nearest-even equals
// one round-to-nearest-even of the double.
float round_to_odd_float(double value) {
  float f = static_cast<float>(value);
  if (!std::isfinite(value) || static_cast<double>(f) == value) return f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(value)) f = std::nextafter(f, 0.0f);
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  bits |= 1u;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

template <class T>
T round_unscaled(double value) {
  if constexpr (std::is_same_v<T, float>) return static_cast<float>(value);
  else return from_float<T>(round_to_odd_float(value));
}

// Unscales n elements in place (unless `write` is false) and returns how many were
// non-finite as they arrived.
template <class T>
int64_t unscale_elements(T* p, int64_t n, double inv_scale, bool write) {
  int64_t bad = 0;
  if (!write) {
#pragma omp parallel for schedule(static) reduction(+ : bad) if (n > kParallelWorkCheap)
    for (int64_t i = 0; i < n; ++i) bad += is_finite_value(to_float(p[i])) ? 0 : 1;
    return bad;
  }
#pragma omp parallel for schedule(static) reduction(+ : bad) if (n > kParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const float g = to_float(p[i]);
    bad += is_finite_value(g) ? 0 : 1;
    p[i] = round_unscaled<T>(unscale_value(g, inv_scale));
  }
  return bad;
}

// ---- sums of squares -------------------------------------------------------------------

// Sum of squares of a contiguous run in FP32: eight interleaved accumulators over blocks of
// kRunBlock, blocks added in order, so the order is fixed by n alone and the rounding error
// grows with kRunBlock / 8 + n / kRunBlock rather than with n.
template <class T>
float sum_squares_run(const void* data, int64_t begin, int64_t n) {
  constexpr int kLanes = 8;
  const T* p = static_cast<const T*>(data) + begin;
  float buf[kRunBlock];
  float total = 0.0f;
  for (int64_t b = 0; b < n; b += kRunBlock) {
    const int64_t len = std::min(kRunBlock, n - b);
    const float* v = cpu::load_f32(p + b, buf, len);
    float lane[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= len; i += kLanes)
      for (int j = 0; j < kLanes; ++j) lane[j] += v[i + j] * v[i + j];
    float block = 0.0f;
    for (; i < len; ++i) block += v[i] * v[i];
    for (int j = 0; j < kLanes; ++j) block += lane[j];
    total += block;
  }
  return total;
}

using SumSquaresFn = float (*)(const void*, int64_t, int64_t);

// One partial sum: chunk [begin, begin + len) of tensor `index`.
struct NormTask {
  size_t index;
  int64_t begin;
  int64_t len;
};

// ---- SGD -------------------------------------------------------------------------------

// W is the working copy's storage type (float when there is none, or an F32 copy). The
// block of new master values is rounded into the working copy right after it is written,
// with the bulk converters (bit-identical to from_float<W>).
template <class W>
void sgd_elements(const SgdHyper& hyper, float* w, const float* g, float* buf, W* working,
                  int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n > kParallelWork)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t begin = blk * kBlock, end = std::min(n, begin + kBlock);
    for (int64_t i = begin; i < end; ++i) {
      float b = buf != nullptr ? buf[i] : 0.0f;
      sgd_update(w[i], g[i], b, hyper);
      if (buf != nullptr) buf[i] = b;
    }
    if (working != nullptr) cpu::store_f32(w + begin, working + begin, end - begin);
  }
}

}  // namespace

void CpuBackend::unscale_and_check(const std::vector<Tensor>& grads, double inv_scale,
                                   Tensor& found_inf, Tensor& tensor_flags) {
  constexpr const char* kOp = "unscale_and_check";
  MIXPREC_CHECK(std::isfinite(inv_scale) && inv_scale > 0, kOp,
                ": inv_scale must be finite and positive, got ", inv_scale);
  check_found_inf(kOp, found_inf);
  MIXPREC_CHECK(tensor_flags.defined(), kOp, ": tensor_flags is undefined; pass an I32 [",
                grads.size(), "] tensor");
  check_on_cpu(kOp, "tensor_flags", tensor_flags);
  MIXPREC_CHECK(tensor_flags.dtype() == DType::I32 &&
                    tensor_flags.shape() == Shape{static_cast<int64_t>(grads.size())},
                kOp, ": tensor_flags must be I32 [", grads.size(),
                "] (one flag per gradient), got ", describe(tensor_flags));
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    MIXPREC_CHECK(g.defined(), kOp, ": gradient ", i, " is undefined; pass only defined gradients");
    check_on_cpu(kOp, "gradient", g);
    MIXPREC_CHECK(is_floating(g.dtype()), kOp, ": gradient ", i, " is ", describe(g),
                  "; gradients must be F32, F16 or BF16");
  }

  // inv_scale == 1 is a pure check: no store at all, so the bits (NaN payloads included)
  // stay exactly as they were.
  const bool write = inv_scale != 1.0;
  int32_t* flags = tensor_flags.data_as<int32_t>();
  bool any = false;
  for (size_t i = 0; i < grads.size(); ++i) {
    Tensor g = grads[i];
    const int64_t bad = MIXPREC_DISPATCH_FLOATING(g.dtype(), kOp, [&] {
      return unscale_elements(g.data_as<scalar_t>(), g.numel(), inv_scale, write);
    });
    flags[i] = bad > 0 ? 1 : 0;
    any = any || bad > 0;
  }
  if (any) found_inf.data_as<float>()[0] = 1.0f;
}

void CpuBackend::squared_norms(const std::vector<Tensor>& xs, Tensor& out) {
  constexpr const char* kOp = "squared_norms";
  MIXPREC_CHECK(out.defined(), kOp, ": out is undefined; pass an F32 [", xs.size(), "] tensor");
  check_on_cpu(kOp, "out", out);
  MIXPREC_CHECK(out.dtype() == DType::F32 && out.shape() == Shape{static_cast<int64_t>(xs.size())},
                kOp, ": out must be F32 [", xs.size(), "] (one value per tensor), got ",
                describe(out));

  std::vector<SumSquaresFn> fns(xs.size());
  std::vector<NormTask> tasks;
  int64_t total = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    MIXPREC_CHECK(x.defined(), kOp, ": tensor ", i, " is undefined");
    check_on_cpu(kOp, "tensor", x);
    fns[i] = MIXPREC_DISPATCH_FLOATING(x.dtype(), kOp, [&] {
      return static_cast<SumSquaresFn>(&sum_squares_run<scalar_t>);
    });
    const int64_t n = x.numel();
    for (int64_t begin = 0; begin < n; begin += kReduceChunk)
      tasks.push_back({i, begin, std::min(kReduceChunk, n - begin)});
    total += n;
  }

  // The chunks of all tensors form one task list, so many small tensors spread over the
  // threads as well as one large one does.
  std::vector<float> partial(tasks.size());
  const int64_t count = static_cast<int64_t>(tasks.size());
#pragma omp parallel for schedule(static) if (total > kParallelWork && count > 1)
  for (int64_t t = 0; t < count; ++t) {
    const NormTask& task = tasks[static_cast<size_t>(t)];
    partial[static_cast<size_t>(t)] = fns[task.index](xs[task.index].data(), task.begin, task.len);
  }

  float* o = out.data_as<float>();
  std::fill(o, o + xs.size(), 0.0f);
  for (size_t t = 0; t < tasks.size(); ++t) o[tasks[t].index] += partial[t];
}

// `working` may be F16 or BF16 (the usual case), or F32 when it is a tensor distinct from
// the master (a plain copy, e.g. a replica). A working pointer that refers to the master's own
// storage is rejected: under an F32 policy the master is its own working copy, and the
// caller passes null.
void CpuBackend::sgd_step(const SgdHyper& hyper, Tensor& master, const Tensor& grad,
                          Tensor* momentum, Tensor* working, const Tensor* found_inf) {
  constexpr const char* kOp = "sgd_step";
  MIXPREC_CHECK(master.defined() && grad.defined(), kOp, ": master and grad must be defined");
  check_on_cpu(kOp, "master", master);
  check_on_cpu(kOp, "grad", grad);
  MIXPREC_CHECK(master.dtype() == DType::F32, kOp, ": the master must be F32, got ",
                describe(master));
  MIXPREC_CHECK(grad.dtype() == DType::F32 && grad.shape() == master.shape(), kOp,
                ": the gradient ", describe(grad), " must be F32 with the master's shape ",
                describe(master));
  const bool use_momentum = hyper.momentum != 0.0f;
  MIXPREC_CHECK(!use_momentum || momentum != nullptr, kOp,
                ": momentum ", hyper.momentum, " needs a momentum buffer (F32, ",
                describe(master), "); pass one");
  if (momentum != nullptr) {
    MIXPREC_CHECK(momentum->defined(), kOp, ": the momentum buffer is undefined");
    check_on_cpu(kOp, "momentum buffer", *momentum);
    MIXPREC_CHECK(momentum->dtype() == DType::F32 && momentum->shape() == master.shape(), kOp,
                  ": the momentum buffer ", describe(*momentum), " must be F32 with the master's "
                  "shape ", describe(master));
  }
  if (working != nullptr) {
    MIXPREC_CHECK(working->defined(), kOp, ": the working copy is undefined; pass null for none");
    check_on_cpu(kOp, "working copy", *working);
    MIXPREC_CHECK(is_floating(working->dtype()) && working->shape() == master.shape(), kOp,
                  ": the working copy ", describe(*working), " must be F16, BF16 or F32 with the "
                  "master's shape ", describe(master));
    MIXPREC_CHECK(working->data() != master.data() || master.numel() == 0, kOp,
                  ": the working copy shares the master's storage; pass null when the master is "
                  "its own working copy");
  }
  if (found_inf != nullptr) {
    check_found_inf(kOp, *found_inf);
    if (found_inf->data_as<float>()[0] != 0.0f) return;
  }

  const int64_t n = master.numel();
  float* w = master.data_as<float>();
  const float* g = grad.data_as<float>();
  float* buf = use_momentum ? momentum->data_as<float>() : nullptr;
  if (working == nullptr) return sgd_elements<float>(hyper, w, g, buf, nullptr, n);
  MIXPREC_DISPATCH_FLOATING(working->dtype(), kOp, [&] {
    sgd_elements(hyper, w, g, buf, working->data_as<scalar_t>(), n);
  });
}

}  // namespace mixprec
