// 2-D convolution of the CUDA backend through cuDNN's convolution API (cudnnConvolution*,
// deprecated in cuDNN 9 in favour of the graph API but complete and supported throughout
// 9.x).
//
// Numerics (the CPU backend's, core/backend.h): NCHW tensors of one dtype; F16 and BF16 are
// convolved with FP32 accumulation (compute type CUDNN_DATA_FLOAT, cuDNN's "pseudo half"
// configuration) and rounded once on store. F32 convolutions run with CUDNN_FMA_MATH, which
// excludes TF32 tensor cores, unless tf32_allowed().
//
// - Bias: y is first filled with the bias broadcast over N, H and W (an exact copy: the bias
//   has y's dtype), then the convolution blends into it with beta = 1, so conv + bias is
//   summed in FP32 and rounded once, as the CPU backend does; a separate add after the
//   convolution would round a 16-bit y twice.
// - dbias: the sum of dy over N, H and W by the backend's sum_to kernel, in FP32 and in an
//   order fixed by the shape (cuda/kernels/broadcast.h).
// - Algorithms: one plan per pass and problem (shape, stride, padding, dtype, TF32 switch,
//   device) holds the cuDNN descriptors and the algorithm, chosen on first use from
//   cudnnGet*Algorithm_v7's ranking: the fastest that is deterministic and needs at most
//   kMaxWorkspace bytes of workspace. Determinism rules out backward-data ALGO_0 and
//   backward-filter ALGO_0 and ALGO_3, which sum with atomics in an order that changes from
//   run to run. Only when no deterministic algorithm is offered within the workspace limit
//   is the heuristic's best non-deterministic one taken (cuDNN's deterministic ALGO_1 of
//   both passes is documented for plain NCHW cross-correlation, so this is not expected).
//   The heuristic is used rather than cudnnFind*, which times every algorithm: the choice
//   would then depend on timing noise and could differ between runs. With the opt-in
//   autotune switch (cuda/conv_autotune.h) every deterministic algorithm of the ranking that
//   fits is timed on the first call of a problem instead, and the fastest is kept.
// - Workspace: from the backend's caching allocator for the duration of the call.
#include <climits>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/backend_checks.h"
#include "core/error.h"
#include "core/math/window.h"
#include "core/math_mode.h"
#include "core/tensor.h"
#include "cuda/cuda_backend.h"
#include "cuda/conv_autotune.h"
#include "cuda/cuda_check.h"
#include "cuda/kernel_profile.h"
#include "cuda/kernels/broadcast.h"

namespace mixprec {
namespace {

// Largest workspace an algorithm may use. Beyond it the next-ranked algorithm is taken
// (FFT-based ones can ask for gigabytes on large images).
constexpr size_t kMaxWorkspace = size_t{512} << 20;

using backend_checks::Conv2dGeometry;

// F32, F16 and BF16 only: the I32 refusal comes before any device work.
void check_floating(const char* op, const Tensor& t) {
  MIXPREC_CHECK(is_floating(t.dtype()), op, ": unsupported dtype ", t.dtype(),
                " on the CUDA backend; convolutions take F32, F16 or BF16");
}

cudnnDataType_t cudnn_type(const char* op, DType dtype) {
  switch (dtype) {
    case DType::F32: return CUDNN_DATA_FLOAT;
    case DType::F16: return CUDNN_DATA_HALF;
    case DType::BF16: return CUDNN_DATA_BFLOAT16;
    default: MIXPREC_FAIL(op, ": unsupported dtype ", dtype, " on the CUDA backend");
  }
}

// cuDNN's descriptors take int extents, and its convolutions index with 32 bits.
void check_cudnn_limits(const char* op, const Tensor& x, const Tensor& w, const Tensor& y,
                        const Conv2dDesc& d) {
  for (const Tensor* t : {&x, &w, &y}) {
    MIXPREC_CHECK(t->numel() <= INT32_MAX, op, ": ", describe(*t), " has 2^31 elements or more, "
                  "beyond cuDNN's convolutions; split the batch");
  }
  MIXPREC_CHECK(d.stride_h <= INT32_MAX && d.stride_w <= INT32_MAX && d.pad_h <= INT32_MAX &&
                    d.pad_w <= INT32_MAX,
                op, ": stride or padding beyond cuDNN's int range");
}

enum class ConvPass { Forward, BackwardData, BackwardFilter };

const char* pass_name(ConvPass pass) {
  switch (pass) {
    case ConvPass::Forward: return "conv2d";
    case ConvPass::BackwardData: return "conv2d_backward_data";
    case ConvPass::BackwardFilter: return "conv2d_backward_filter";
  }
  return "conv2d";
}

struct ConvKey {
  int device;
  ConvPass pass;
  DType dtype;
  bool tf32;
  bool tuned;  // the autotune switch when the plan was made: tuned and heuristic plans differ
  bool nondeterministic;  // likewise the switch that admits algorithms with atomics
  int64_t n, c, h, w, o, kh, kw, sh, sw, ph, pw;
  auto operator<=>(const ConvKey&) const = default;
};

class TensorDesc {
 public:
  TensorDesc(cudnnDataType_t type, int64_t n, int64_t c, int64_t h, int64_t w) {
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&desc_));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(desc_, CUDNN_TENSOR_NCHW, type, static_cast<int>(n),
                                           static_cast<int>(c), static_cast<int>(h),
                                           static_cast<int>(w)));
  }
  ~TensorDesc() { cudnnDestroyTensorDescriptor(desc_); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
  cudnnTensorDescriptor_t get() const { return desc_; }

 private:
  cudnnTensorDescriptor_t desc_ = nullptr;
};

class FilterDesc {
 public:
  FilterDesc(cudnnDataType_t type, int64_t o, int64_t c, int64_t kh, int64_t kw) {
    CUDNN_CHECK(cudnnCreateFilterDescriptor(&desc_));
    CUDNN_CHECK(cudnnSetFilter4dDescriptor(desc_, type, CUDNN_TENSOR_NCHW, static_cast<int>(o),
                                           static_cast<int>(c), static_cast<int>(kh),
                                           static_cast<int>(kw)));
  }
  ~FilterDesc() { cudnnDestroyFilterDescriptor(desc_); }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
  cudnnFilterDescriptor_t get() const { return desc_; }

 private:
  cudnnFilterDescriptor_t desc_ = nullptr;
};

class ConvDesc {
 public:
  explicit ConvDesc(const ConvKey& key) {
    CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&desc_));
    // Cross-correlation (no filter flip) is what conv2d computes; the compute type is FP32
    // for every data type.
    CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
        desc_, static_cast<int>(key.ph), static_cast<int>(key.pw), static_cast<int>(key.sh),
        static_cast<int>(key.sw), 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    set_math(initial_math(key));
  }
  ~ConvDesc() { cudnnDestroyConvolutionDescriptor(desc_); }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
  cudnnConvolutionDescriptor_t get() const { return desc_; }
  void set_math(cudnnMathType_t math) { CUDNN_CHECK(cudnnSetConvolutionMathType(desc_, math)); }

  // The math type the heuristic is asked with (it then ranks algorithms for it): tensor
  // cores for 16-bit data; for F32, TF32 tensor cores only when allowed.
  static cudnnMathType_t initial_math(const ConvKey& key) {
    if (key.dtype != DType::F32) return CUDNN_TENSOR_OP_MATH;
    return key.tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
  }

 private:
  cudnnConvolutionDescriptor_t desc_ = nullptr;
};

// The descriptors and algorithm of one pass of one problem. The algorithm is stored as an
// int and cast back to the pass's enum.
struct ConvPlan {
  explicit ConvPlan(const ConvKey& key)
      : x(cudnn_type(pass_name(key.pass), key.dtype), key.n, key.c, key.h, key.w),
        y(cudnn_type(pass_name(key.pass), key.dtype), key.n, key.o,
          window_output_size(key.h, key.kh, key.sh, key.ph),
          window_output_size(key.w, key.kw, key.sw, key.pw)),
        w(cudnn_type(pass_name(key.pass), key.dtype), key.o, key.c, key.kh, key.kw),
        conv(key) {}

  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;
  int algo = 0;
  size_t workspace = 0;
  std::string label;  // the problem and its algorithm, as the kernel profile names its calls
};

std::string problem_str(const ConvKey& k) {
  return std::string(pass_name(k.pass)) + " of input [" + std::to_string(k.n) + ", " +
         std::to_string(k.c) + ", " + std::to_string(k.h) + ", " + std::to_string(k.w) +
         "] with filter [" + std::to_string(k.o) + ", " + std::to_string(k.c) + ", " +
         std::to_string(k.kh) + ", " + std::to_string(k.kw) + "], stride " +
         std::to_string(k.sh) + "x" + std::to_string(k.sw) + ", padding " +
         std::to_string(k.ph) + "x" + std::to_string(k.pw);
}

// The extents of a tensor as "n x c x h x w".
std::string extents_str(int64_t n, int64_t c, int64_t h, int64_t w) {
  return std::to_string(n) + "x" + std::to_string(c) + "x" + std::to_string(h) + "x" +
         std::to_string(w);
}

// cuDNN's name of a pass's algorithm, without its enum prefix.
const char* algorithm_name(ConvPass pass, int algo) {
  switch (pass) {
    case ConvPass::Forward:
      switch (static_cast<cudnnConvolutionFwdAlgo_t>(algo)) {
        case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM: return "IMPLICIT_GEMM";
        case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM: return "IMPLICIT_PRECOMP_GEMM";
        case CUDNN_CONVOLUTION_FWD_ALGO_GEMM: return "GEMM";
        case CUDNN_CONVOLUTION_FWD_ALGO_DIRECT: return "DIRECT";
        case CUDNN_CONVOLUTION_FWD_ALGO_FFT: return "FFT";
        case CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING: return "FFT_TILING";
        case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD: return "WINOGRAD";
        case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED: return "WINOGRAD_NONFUSED";
        default: return "unknown";
      }
    case ConvPass::BackwardData:
      switch (static_cast<cudnnConvolutionBwdDataAlgo_t>(algo)) {
        case CUDNN_CONVOLUTION_BWD_DATA_ALGO_0: return "ALGO_0";
        case CUDNN_CONVOLUTION_BWD_DATA_ALGO_1: return "ALGO_1";
        case CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT: return "FFT";
        case CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING: return "FFT_TILING";
        case CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD: return "WINOGRAD";
        case CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED: return "WINOGRAD_NONFUSED";
        default: return "unknown";
      }
    case ConvPass::BackwardFilter:
      switch (static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo)) {
        case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0: return "ALGO_0";
        case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1: return "ALGO_1";
        case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT: return "FFT";
        case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3: return "ALGO_3";
        case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED: return "WINOGRAD_NONFUSED";
        case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING: return "FFT_TILING";
        default: return "unknown";
      }
  }
  return "unknown";
}

const char* math_name(cudnnMathType_t math) {
  switch (math) {
    case CUDNN_DEFAULT_MATH: return "default math";
    case CUDNN_TENSOR_OP_MATH: return "tensor op math";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION: return "tensor op math with conversion";
    case CUDNN_FMA_MATH: return "FMA math";
  }
  return "unknown math";
}

// The cuDNN function and the problem (input and filter extents, stride, padding, dtype), e.g.
// "cudnnConvolutionBackwardFilter 512x1x28x28 * 32x1x3x3 (stride 1x1, padding 1x1) F16".
std::string problem_label(const ConvKey& k) {
  const char* function = k.pass == ConvPass::Forward        ? "cudnnConvolutionForward"
                         : k.pass == ConvPass::BackwardData ? "cudnnConvolutionBackwardData"
                                                            : "cudnnConvolutionBackwardFilter";
  return std::string(function) + " " + extents_str(k.n, k.c, k.h, k.w) + " * " +
         extents_str(k.o, k.c, k.kh, k.kw) + " (stride " + std::to_string(k.sh) + "x" +
         std::to_string(k.sw) + ", padding " + std::to_string(k.ph) + "x" +
         std::to_string(k.pw) + ") " + std::string(dtype_name(k.dtype));
}

// How the kernel profile names a plan's calls: the problem, then the algorithm with its math
// type (", ALGO_1, tensor op math"): a slow pass then shows which algorithm it ran.
std::string plan_label(const ConvKey& k, int algo, cudnnMathType_t math) {
  return problem_label(k) + ", " + algorithm_name(k.pass, algo) + ", " + math_name(math);
}

// An algorithm a plan may run: its enum value as an int, the math type it runs with, and the
// workspace it needs with that math type.
struct ConvCandidate {
  int algo;
  cudnnMathType_t math;
  size_t workspace;
  bool deterministic;
};

// The algorithms of the heuristic's ranking `perfs` (best first) that a plan may run, in that
// order: those that succeeded, are deterministic (unless none is, or the key admits
// non-deterministic ones) and whose workspace, asked again with the math type they will run
// with, fits kMaxWorkspace. Only the first unless the key is tuned. `workspace_of(algo,
// &bytes)` is the pass's cudnnGet*WorkspaceSize (it reads the plan's math type, which this
// sets per candidate).
template <class Perf, class WorkspaceOf>
std::vector<ConvCandidate> eligible_algorithms(const ConvKey& key, ConvPlan& plan,
                                               const Perf* perfs, int count,
                                               const WorkspaceOf& workspace_of) {
  for (const bool deterministic_only : {true, false}) {
    if (deterministic_only && key.nondeterministic) continue;
    std::vector<ConvCandidate> found;
    for (int i = 0; i < count; ++i) {
      const Perf& p = perfs[i];
      if (p.status != CUDNN_STATUS_SUCCESS) continue;
      if (deterministic_only && p.determinism != CUDNN_DETERMINISTIC) continue;
      // The heuristic names the math type that goes with the algorithm; an F32 problem keeps
      // FMA math whatever it says, so TF32 stays off unless allowed.
      const cudnnMathType_t math =
          key.dtype == DType::F32 && !key.tf32 ? CUDNN_FMA_MATH : p.mathType;
      plan.conv.set_math(math);
      size_t bytes = 0;
      if (workspace_of(p.algo, &bytes) != CUDNN_STATUS_SUCCESS || bytes > kMaxWorkspace) continue;
      found.push_back(
          {static_cast<int>(p.algo), math, bytes, p.determinism == CUDNN_DETERMINISTIC});
      if (!key.tuned) break;
    }
    if (!found.empty()) return found;
  }
  MIXPREC_FAIL(problem_str(key), ", ", key.dtype, ": cuDNN offers no algorithm within ",
               kMaxWorkspace >> 20, " MiB of workspace; reduce the batch or the image size");
}

std::vector<ConvCandidate> eligible_algorithms(cudnnHandle_t handle, const ConvKey& key,
                                               ConvPlan& plan) {
  int count = 0;
  switch (key.pass) {
    case ConvPass::Forward: {
      cudnnConvolutionFwdAlgoPerf_t perfs[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
      CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(handle, plan.x.get(), plan.w.get(),
                                                         plan.conv.get(), plan.y.get(),
                                                         CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count,
                                                         perfs));
      return eligible_algorithms(key, plan, perfs, count,
                                 [&](cudnnConvolutionFwdAlgo_t algo, size_t* bytes) {
        return cudnnGetConvolutionForwardWorkspaceSize(handle, plan.x.get(), plan.w.get(),
                                                       plan.conv.get(), plan.y.get(), algo, bytes);
      });
    }
    case ConvPass::BackwardData: {
      cudnnConvolutionBwdDataAlgoPerf_t perfs[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
          handle, plan.w.get(), plan.y.get(), plan.conv.get(), plan.x.get(),
          CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, perfs));
      return eligible_algorithms(key, plan, perfs, count,
                                 [&](cudnnConvolutionBwdDataAlgo_t algo, size_t* bytes) {
                                   return cudnnGetConvolutionBackwardDataWorkspaceSize(
                                       handle, plan.w.get(), plan.y.get(), plan.conv.get(),
                                       plan.x.get(), algo, bytes);
                                 });
    }
    case ConvPass::BackwardFilter: {
      cudnnConvolutionBwdFilterAlgoPerf_t perfs[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
      CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
          handle, plan.x.get(), plan.y.get(), plan.conv.get(), plan.w.get(),
          CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, perfs));
      return eligible_algorithms(key, plan, perfs, count,
                                 [&](cudnnConvolutionBwdFilterAlgo_t algo, size_t* bytes) {
                                   return cudnnGetConvolutionBackwardFilterWorkspaceSize(
                                       handle, plan.x.get(), plan.y.get(), plan.conv.get(),
                                       plan.w.get(), algo, bytes);
                                 });
    }
  }
  MIXPREC_FAIL("conv2d: unknown pass ", static_cast<int>(key.pass));
}

// One pass of the convolution: out = alpha * conv + beta * out, with alpha 1. The inputs are
// (x, w) forward, (w, dy) backward-data and (x, dy) backward-filter; out is y, dx and dw.
cudnnStatus_t run_pass(cudnnHandle_t handle, ConvPass pass, const ConvPlan& plan, int algo,
                       const void* in0, const void* in1, void* workspace, size_t workspace_bytes,
                       float beta, void* out) {
  const float alpha = 1.0f;
  switch (pass) {
    case ConvPass::Forward:
      return cudnnConvolutionForward(handle, &alpha, plan.x.get(), in0, plan.w.get(), in1,
                                     plan.conv.get(), static_cast<cudnnConvolutionFwdAlgo_t>(algo),
                                     workspace, workspace_bytes, &beta, plan.y.get(), out);
    case ConvPass::BackwardData:
      return cudnnConvolutionBackwardData(
          handle, &alpha, plan.w.get(), in0, plan.y.get(), in1, plan.conv.get(),
          static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), workspace, workspace_bytes, &beta,
          plan.x.get(), out);
    case ConvPass::BackwardFilter:
      return cudnnConvolutionBackwardFilter(
          handle, &alpha, plan.x.get(), in0, plan.y.get(), in1, plan.conv.get(),
          static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), workspace, workspace_bytes, &beta,
          plan.w.get(), out);
  }
  return CUDNN_STATUS_BAD_PARAM;
}

// The call that meets a new problem: its inputs (run_pass's in0 and in1) and its output's
// bytes, which a tuned plan times its candidates on.
struct ConvCall {
  const void* in0;
  const void* in1;
  size_t output_bytes;
  cudaStream_t stream;
  CachingAllocator& allocator;
};

// Chooses the plan's algorithm among `candidates` (at least one): the first, or with a tuned
// key and several candidates, the fastest on `call`'s data (conv_autotune.h).
void choose_algorithm(cudnnHandle_t handle, const ConvKey& key, ConvPlan& plan,
                      const std::vector<ConvCandidate>& candidates, const ConvCall& call) {
  size_t chosen = 0;
  if (key.tuned && candidates.size() > 1) {
    TuningCandidates tuning;
    for (const ConvCandidate& c : candidates) tuning.workspace_bytes.push_back(c.workspace);
    tuning.output_bytes = call.output_bytes;
    tuning.launch = [&](size_t i, void* output, void* workspace) {
      plan.conv.set_math(candidates[i].math);
      return run_pass(handle, key.pass, plan, candidates[i].algo, call.in0, call.in1, workspace,
                      candidates[i].workspace, 0.0f, output) == CUDNN_STATUS_SUCCESS;
    };
    tuning.problem = problem_label(key);
    tuning.name = [&](size_t i) {
      const ConvCandidate& c = candidates[i];
      return std::string(algorithm_name(key.pass, c.algo)) + ", " + math_name(c.math) +
             (c.deterministic ? "" : ", non-deterministic") + ", workspace " +
             std::to_string(c.workspace) + " bytes";
    };
    chosen = conv_autotuner().pick_fastest(tuning, call.stream, call.allocator);
  }
  plan.conv.set_math(candidates[chosen].math);
  plan.algo = candidates[chosen].algo;
  plan.workspace = candidates[chosen].workspace;
  plan.label = plan_label(key, plan.algo, candidates[chosen].math);
}

// Plans of every problem met so far, never evicted (a training run has a fixed set of
// shapes); a plan stays at its address once inserted.
class PlanCache {
 public:
  // `call` is used only when the plan is new (and tuned). Tuning happens under the lock, so
  // that two threads meeting a new problem at once do not both time it.
  const ConvPlan& get(cudnnHandle_t handle, const ConvKey& key, const ConvCall& call) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::unique_ptr<ConvPlan>& slot = plans_[key];
    if (!slot) {
      auto plan = std::make_unique<ConvPlan>(key);
      choose_algorithm(handle, key, *plan, eligible_algorithms(handle, key, *plan), call);
      slot = std::move(plan);
    }
    return *slot;
  }

 private:
  std::mutex mutex_;
  std::map<ConvKey, std::unique_ptr<ConvPlan>> plans_;
};

// Never destroyed: plans' labels name convolutions in the kernel profile, whose report is
// written at exit (cuda/kernel_profile.h), and the descriptors need no release at exit.
PlanCache& plan_cache() {
  static PlanCache* cache = new PlanCache;
  return *cache;
}

ConvKey conv_key(int device, ConvPass pass, DType dtype, const Conv2dGeometry& g) {
  return {.device = device, .pass = pass, .dtype = dtype,
          .tf32 = dtype == DType::F32 && tf32_allowed(), .tuned = conv_autotune_enabled(),
          .nondeterministic = conv_nondeterministic_allowed(),
          .n = g.n, .c = g.c, .h = g.h, .w = g.w, .o = g.o, .kh = g.kh, .kw = g.kw,
          .sh = g.sh, .sw = g.sw, .ph = g.ph, .pw = g.pw};
}

// cuDNN cannot describe a tensor with a zero extent; such problems are finished without it.
bool degenerate(const Tensor& x, const Tensor& w, const Tensor& y) {
  return x.numel() == 0 || w.numel() == 0 || y.numel() == 0;
}

}  // namespace

void CudaBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor* bias,
                         const Conv2dDesc& desc, Tensor& y) {
  constexpr const char* kOp = "conv2d";
  const Conv2dGeometry g = backend_checks::conv2d(device(), x, w, bias, desc, y);
  check_floating(kOp, x);
  if (y.numel() == 0) return;
  check_cudnn_limits(kOp, x, w, y, desc);
  use_device();
  float beta = 0.0f;
  if (bias) {
    kernels::expand(y.dtype(), bias->data(), Shape{g.o, 1, 1}, y.data(), y.shape(), 1.0f, stream_);
    beta = 1.0f;
  }
  if (degenerate(x, w, y)) {
    // An empty sum per output: y is the bias, or zero.
    if (!bias) fill(y, 0.0);
    return;
  }
  cudnnHandle_t handle = cudnn_handle();
  const ConvPlan& plan =
      plan_cache().get(handle, conv_key(device_index_, ConvPass::Forward, x.dtype(), g),
                       {x.data(), w.data(), y.nbytes(), stream_, allocator_});
  Scratch workspace(allocator_, plan.workspace);
  const ProfiledLaunch timed(plan.label.c_str(), __PRETTY_FUNCTION__, stream_);
  CUDNN_CHECK(run_pass(handle, ConvPass::Forward, plan, plan.algo, x.data(), w.data(),
                       workspace.get(), plan.workspace, beta, y.data()));
}

void CudaBackend::conv2d_backward_data(const Tensor& dy, const Tensor& w, const Conv2dDesc& desc,
                                       Tensor& dx) {
  constexpr const char* kOp = "conv2d_backward_data";
  const Conv2dGeometry g = backend_checks::conv2d_backward_data(device(), dy, w, desc, dx);
  check_floating(kOp, dy);
  if (dx.numel() == 0) return;
  check_cudnn_limits(kOp, dx, w, dy, desc);
  use_device();
  if (degenerate(dx, w, dy)) return fill(dx, 0.0);
  cudnnHandle_t handle = cudnn_handle();
  const ConvPlan& plan =
      plan_cache().get(handle, conv_key(device_index_, ConvPass::BackwardData, dy.dtype(), g),
                       {w.data(), dy.data(), dx.nbytes(), stream_, allocator_});
  Scratch workspace(allocator_, plan.workspace);
  const ProfiledLaunch timed(plan.label.c_str(), __PRETTY_FUNCTION__, stream_);
  CUDNN_CHECK(run_pass(handle, ConvPass::BackwardData, plan, plan.algo, w.data(), dy.data(),
                       workspace.get(), plan.workspace, 0.0f, dx.data()));
}

void CudaBackend::conv2d_backward_filter(const Tensor& x, const Tensor& dy, const Conv2dDesc& desc,
                                         Tensor& dw, Tensor* dbias) {
  constexpr const char* kOp = "conv2d_backward_filter";
  const Conv2dGeometry g = backend_checks::conv2d_backward_filter(device(), x, dy, desc, dw, dbias);
  check_floating(kOp, x);
  if (dw.numel() == 0 && (!dbias || dbias->numel() == 0)) return;
  check_cudnn_limits(kOp, x, dw, dy, desc);
  use_device();

  if (dbias && dbias->numel() > 0) {
    if (dy.numel() == 0) {
      fill(*dbias, 0.0);
    } else if (dy.numel() == g.o) {
      // One value per channel: the sum is the value itself.
      CUDA_CHECK(cudaMemcpyAsync(dbias->data(), dy.data(), dy.nbytes(), cudaMemcpyDeviceToDevice,
                                 stream_));
    } else {
      const kernels::SumToPlan reduce = kernels::plan_sum_to(dy.shape(), Shape{g.o, 1, 1});
      Scratch partials(allocator_, reduce.scratch_floats() * sizeof(float));
      kernels::sum_to(reduce, dy.dtype(), dy.data(), dbias->data(), 1.0f,
                      static_cast<float*>(partials.get()), stream_);
    }
  }
  if (dw.numel() == 0) return;
  if (degenerate(x, dw, dy)) return fill(dw, 0.0);
  cudnnHandle_t handle = cudnn_handle();
  const ConvPlan& plan =
      plan_cache().get(handle, conv_key(device_index_, ConvPass::BackwardFilter, x.dtype(), g),
                       {x.data(), dy.data(), dw.nbytes(), stream_, allocator_});
  Scratch workspace(allocator_, plan.workspace);
  const ProfiledLaunch timed(plan.label.c_str(), __PRETTY_FUNCTION__, stream_);
  CUDNN_CHECK(run_pass(handle, ConvPass::BackwardFilter, plan, plan.algo, x.data(), dy.data(),
                       workspace.get(), plan.workspace, 0.0f, dw.data()));
}

}  // namespace mixprec
