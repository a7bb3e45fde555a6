// GEMM of the CUDA backend through cuBLASLt.
//
// Row-major onto column-major: map_gemm_to_cublaslt (gemm_plan.h) decides which operand
// becomes cuBLASLt's A and B, their transpose flags and layouts; this file only turns that
// mapping into descriptors.
//
// Numerics (the CPU backend's, core/backend.h): 16-bit operands are multiplied with FP32
// accumulation (CUBLAS_COMPUTE_32F, tensor cores), alpha and beta are FP32 (scale type
// CUDA_R_32F), and D is rounded once on store. FP32 operands use CUBLAS_COMPUTE_32F, which
// never rounds inputs to TF32; CUBLAS_COMPUTE_32F_FAST_TF32 only while tf32_allowed(). For
// a 16-bit D, split-K algorithms that keep partial sums in D's type (the in-place and
// output-type reduction schemes) are excluded, as they would round the sum more than once.
//
// One plan per problem (dtypes, flags, sizes, strides, operand alignments, TF32 switch,
// autotune switch, device): the cuBLASLt descriptors and one algorithm, built on first use
// and then reused, so a training step repeats no heuristic query. The algorithm is the
// heuristic's first; with the autotune switch on (cuda/gemm_autotune.h), the fastest of the
// heuristic's candidates timed on that first call. An algorithm's workspace (at most
// kMaxWorkspace) comes from the backend's caching allocator for the duration of the call, so
// after warm-up no call reaches cudaMalloc.
//
// A linear layer's epilogue (gemm_epilogue) is a plan of its own, keyed also by the epilogue
// and the alignments of its bias and pre-GELU pointers (the heuristic reads them from the
// descriptor, which holds the pointers; each call sets its own under the plan's mutex). The
// GELU forms are fused only for 16-bit outputs whose rows are a multiple of 8 elements long
// (the pre-GELU matrix's leading dimension must be): cuBLASLt's GELU is its own, not
// gelu_tanh, which a 16-bit rounding hides but an FP32 result would not. Everything else, and
// any epilogue cuBLASLt offers no algorithm for, is the product into FP32 followed by
// kernels::gemm_epilogue, with the stores of core/backend.h exactly.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/backend_checks.h"
#include "core/error.h"
#include "core/math_mode.h"
#include "core/tensor.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "cuda/gemm_autotune.h"
#include "cuda/gemm_plan.h"
#include "cuda/kernel_profile.h"
#include "cuda/kernels/elementwise.h"
#include "cuda/kernels/gemm_epilogue.h"

namespace mixprec {
namespace {

// Largest workspace the heuristic may pick an algorithm for. cuBLAS recommends 32 MiB on
// Hopper; larger buys nothing measurable for the shapes here.
constexpr uint64_t kMaxWorkspace = uint64_t{32} << 20;
// cuBLASLt's default (and largest useful) operand alignment.
constexpr uint32_t kMaxAlignment = 256;

// Elements of a batched operand that the descriptor touches.
int64_t span(int64_t batch, int64_t stride, int64_t matrix) {
  return (batch - 1) * stride + matrix;
}

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return CUDA_R_32F;
    case DType::F16: return CUDA_R_16F;
    case DType::BF16: return CUDA_R_16BF;
    default: MIXPREC_FAIL("gemm: unsupported dtype ", dtype, " on the CUDA backend");
  }
}

// The alignment in bytes (a power of two, at most kMaxAlignment) that every matrix of a
// batched operand starts on.
uint32_t alignment(const void* base, int64_t batch, int64_t stride, size_t element_size) {
  uint64_t bits = reinterpret_cast<uintptr_t>(base);
  if (batch > 1) bits |= static_cast<uint64_t>(stride) * element_size;
  bits |= kMaxAlignment;
  return static_cast<uint32_t>(bits & (~bits + 1));
}

cublasLtEpilogue_t cublaslt_epilogue(GemmEpilogue epilogue) {
  switch (epilogue) {
    case GemmEpilogue::Bias: return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::Gelu: return CUBLASLT_EPILOGUE_GELU_AUX;
    case GemmEpilogue::BiasGelu: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  }
  MIXPREC_FAIL("gemm_epilogue: unknown epilogue ", static_cast<int>(epilogue));
}

struct GemmKey {
  int device;
  DType ab, c;
  // tuned: the autotune switch when the call was made, so that a tuned and a heuristic plan
  // of one problem can live side by side (a benchmark compares them in one process).
  bool trans_a, trans_b, tf32, tuned;
  int64_t m, n, k, batch, stride_a, stride_b, stride_c;
  uint32_t align_a, align_b, align_c;
  // The fused epilogue (none for a plain product) and the alignments of its bias and
  // pre-GELU pointers, which cuBLASLt's heuristic reads from the descriptor.
  std::optional<GemmEpilogue> epilogue = std::nullopt;
  uint32_t align_bias = 0, align_pre = 0;
  auto operator<=>(const GemmKey&) const = default;
};

// cuBLASLt descriptors of one problem, each destroyed with its owner.
class MatmulDesc {
 public:
  MatmulDesc(cublasComputeType_t compute, cudaDataType_t scale) {
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, compute, scale));
  }
  ~MatmulDesc() { cublasLtMatmulDescDestroy(desc_); }
  MatmulDesc(const MatmulDesc&) = delete;
  MatmulDesc& operator=(const MatmulDesc&) = delete;
  template <class V>
  void set(cublasLtMatmulDescAttributes_t attribute, V value) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, attribute, &value, sizeof value));
  }
  cublasLtMatmulDesc_t get() const { return desc_; }

 private:
  cublasLtMatmulDesc_t desc_ = nullptr;
};

// `batch` column-major matrices laid out as `layout` says.
class MatrixLayout {
 public:
  MatrixLayout(cudaDataType_t type, const LtMatrixLayout& layout, int64_t batch) {
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_, type, static_cast<uint64_t>(layout.rows),
                                            static_cast<uint64_t>(layout.cols), layout.ld));
    if (batch > 1) {
      const int32_t count = static_cast<int32_t>(batch);
      const int64_t stride = layout.stride;
      CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout_, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                    &count, sizeof count));
      CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
          layout_, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
    }
  }
  ~MatrixLayout() { cublasLtMatrixLayoutDestroy(layout_); }
  MatrixLayout(const MatrixLayout&) = delete;
  MatrixLayout& operator=(const MatrixLayout&) = delete;
  cublasLtMatrixLayout_t get() const { return layout_; }

 private:
  cublasLtMatrixLayout_t layout_ = nullptr;
};

class MatmulPreference {
 public:
  MatmulPreference() { CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref_)); }
  ~MatmulPreference() { cublasLtMatmulPreferenceDestroy(pref_); }
  MatmulPreference(const MatmulPreference&) = delete;
  MatmulPreference& operator=(const MatmulPreference&) = delete;
  template <class V>
  void set(cublasLtMatmulPreferenceAttributes_t attribute, V value) {
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref_, attribute, &value, sizeof value));
  }
  cublasLtMatmulPreference_t get() const { return pref_; }

 private:
  cublasLtMatmulPreference_t pref_ = nullptr;
};

GemmDesc gemm_desc(const GemmKey& key) {
  return {.trans_a = key.trans_a,
          .trans_b = key.trans_b,
          .m = key.m,
          .n = key.n,
          .k = key.k,
          .batch = key.batch,
          .stride_a = key.stride_a,
          .stride_b = key.stride_b,
          .stride_c = key.stride_c};
}

// The value that belongs to `source` of the row-major problem's A and B.
template <class T>
T of_operand(GemmOperand source, T for_a, T for_b) {
  return source == GemmOperand::A ? for_a : for_b;
}

int32_t cublas_op(bool transpose) {
  return static_cast<int32_t>(transpose ? CUBLAS_OP_T : CUBLAS_OP_N);
}

// Everything a call of one problem needs besides pointers and alpha/beta. C and D share
// one layout (cuBLASLt requires that when they are the same memory).
struct GemmPlan {
  explicit GemmPlan(const GemmKey& key)
      : mapping(map_gemm_to_cublaslt(gemm_desc(key))),
        desc(key.ab == DType::F32 && key.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
             CUDA_R_32F),
        lt_a(cuda_type(key.ab), mapping.a.layout, mapping.batch),
        lt_b(cuda_type(key.ab), mapping.b.layout, mapping.batch),
        lt_c(cuda_type(key.c), mapping.c, mapping.batch) {
    desc.set(CUBLASLT_MATMUL_DESC_TRANSA, cublas_op(mapping.a.transpose));
    desc.set(CUBLASLT_MATMUL_DESC_TRANSB, cublas_op(mapping.b.transpose));
    if (!key.epilogue) return;
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE,
             static_cast<uint32_t>(cublaslt_epilogue(*key.epilogue)));
    // Column-major D is n x m: the bias runs down its rows, the pre-GELU matrix is laid out as D.
    if (epilogue_has_gelu(*key.epilogue))
      desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, mapping.c.ld);
  }

  // The epilogue's pointers of the coming call (the descriptor holds them); null ones are
  // those the epilogue does not have.
  void point_epilogue(const void* bias, void* pre_gelu) {
    if (bias != nullptr) desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    if (pre_gelu != nullptr) desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, pre_gelu);
  }

  LtGemmMapping mapping;
  MatmulDesc desc;
  MatrixLayout lt_a, lt_b, lt_c;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
  // False when cuBLASLt offers no algorithm for the fused epilogue, or refused a call with
  // the one it offered; the call then takes the separate epilogue kernel (a plain product
  // without one is an error instead). Read without the call mutex, hence atomic.
  std::atomic<bool> available{true};
  std::string label;  // the problem, as the kernel profile names its calls
  // Serialises the epilogue's pointer setting with the matmul that reads them.
  std::mutex call_mutex;
};

std::string problem_str(const GemmKey& k) {
  std::string s = "gemm " + std::to_string(k.m) + "x" + std::to_string(k.n) + "x" +
                  std::to_string(k.k) + " (batch " + std::to_string(k.batch) + ", trans_a " +
                  (k.trans_a ? "1" : "0") + ", trans_b " + (k.trans_b ? "1" : "0") + ")";
  return s;
}

std::string epilogue_str(std::optional<GemmEpilogue> epilogue) {
  if (!epilogue) return "";
  switch (*epilogue) {
    case GemmEpilogue::Bias: return " +bias";
    case GemmEpilogue::Gelu: return " +gelu";
    case GemmEpilogue::BiasGelu: return " +bias+gelu";
  }
  MIXPREC_FAIL("gemm_epilogue: unknown epilogue ", static_cast<int>(*epilogue));
}

// What tuning a new plan needs of the call that first meets its problem: the row-major
// operands, which the candidates read (C only as cuBLASLt's input; D goes to scratch), alpha
// and beta, and the backend's stream and allocator.
struct TuningCall {
  const void* a;
  const void* b;
  const void* c;
  float alpha, beta;
  cudaStream_t stream;
  CachingAllocator& allocator;
};

// How the kernel profile and the tuning log name a problem's calls.
std::string plan_label(const GemmKey& key) {
  return "cublasLtMatmul " + problem_str(key) + " " + std::string(dtype_name(key.ab)) + "->" +
         std::string(dtype_name(key.c)) + epilogue_str(key.epilogue);
}

// Chooses the plan's algorithm among those that fit kMaxWorkspace, the operands' alignments
// and, for a 16-bit D, keep split-K partial sums in FP32: the heuristic's first choice, or
// with key.tuned the fastest of up to kGemmAutotuneCandidates, timed with `call`'s data.
void choose_algorithm(cublasLtHandle_t handle, const GemmKey& key, GemmPlan& plan,
                      const TuningCall& call) {
  MatmulPreference pref;
  pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, kMaxWorkspace);
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
           of_operand(plan.mapping.a.source, key.align_a, key.align_b));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
           of_operand(plan.mapping.b.source, key.align_a, key.align_b));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c);
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c);
  if (key.c != DType::F32) {
    pref.set(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
             static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE));
  }
  cublasLtMatmulHeuristicResult_t results[kGemmAutotuneCandidates]{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      handle, plan.desc.get(), plan.lt_a.get(), plan.lt_b.get(), plan.lt_c.get(), plan.lt_c.get(),
      pref.get(), key.tuned ? kGemmAutotuneCandidates : 1, results, &found);
  std::vector<cublasLtMatmulHeuristicResult_t> valid;
  std::vector<int> rank;  // each valid result's place in the heuristic's list, from 1
  if (status == CUBLAS_STATUS_SUCCESS) {
    for (int i = 0; i < found; ++i) {
      if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
      valid.push_back(results[i]);
      rank.push_back(i + 1);
    }
  }
  if (valid.empty() && key.epilogue) {
    plan.available = false;
    return;
  }
  MIXPREC_CHECK(!valid.empty(), problem_str(key), ": cuBLASLt has no algorithm for ", key.ab,
                " operands into ", key.c, " with operand alignments ", key.align_a, "/",
                key.align_b, "/", key.align_c, " bytes (status ", cublasGetStatusName(status),
                "); pass tensors whose data is at least 16-byte aligned");
  size_t chosen = 0;
  if (key.tuned && valid.size() > 1) {
    GemmTuning tuning;
    for (const auto& candidate : valid) tuning.workspace_bytes.push_back(candidate.workspaceSize);
    tuning.output_bytes = static_cast<size_t>(span(key.batch, key.stride_c, key.m * key.n)) *
                          dtype_size(key.c);
    const void* lt_a_data = of_operand(plan.mapping.a.source, call.a, call.b);
    const void* lt_b_data = of_operand(plan.mapping.b.source, call.a, call.b);
    tuning.launch = [&](size_t i, void* output, void* workspace) {
      return cublasLtMatmul(handle, plan.desc.get(), &call.alpha, lt_a_data, plan.lt_a.get(),
                            lt_b_data, plan.lt_b.get(), &call.beta, call.c, plan.lt_c.get(),
                            output, plan.lt_c.get(), &valid[i].algo, workspace,
                            valid[i].workspaceSize, call.stream) == CUBLAS_STATUS_SUCCESS;
    };
    tuning.problem = plan_label(key);
    tuning.name = [&](size_t i) {
      return "heuristic's choice " + std::to_string(rank[i]) + ", workspace " +
             std::to_string(valid[i].workspaceSize) + " bytes";
    };
    chosen = pick_fastest_gemm_candidate(tuning, call.stream, call.allocator);
  }
  plan.algo = valid[chosen].algo;
  plan.workspace = valid[chosen].workspaceSize;
}

// The plans of every problem met so far, never evicted (a training run has a fixed set of
// shapes). Plans stay at their address once inserted.
class PlanCache {
 public:
  // `call` is used only when the plan is new (and tuned). Tuning happens under the lock, so
  // that two threads meeting a new problem at once do not both time it.
  // An epilogue plan's pointers are those of `call`'s epilogue when it is new.
  GemmPlan& get(cublasLtHandle_t handle, const GemmKey& key, const TuningCall& call,
                const void* bias = nullptr, void* pre_gelu = nullptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::unique_ptr<GemmPlan>& slot = plans_[key];
    if (!slot) {
      auto plan = std::make_unique<GemmPlan>(key);
      if (key.epilogue) plan->point_epilogue(bias, pre_gelu);
      choose_algorithm(handle, key, *plan, call);
      plan->label = plan_label(key);
      slot = std::move(plan);
    }
    return *slot;
  }

 private:
  std::mutex mutex_;
  std::map<GemmKey, std::unique_ptr<GemmPlan>> plans_;
};

// Never destroyed: plans' labels name GEMMs in the kernel profile, whose report is written
// at exit (cuda/kernel_profile.h), and the descriptors need no release at exit.
PlanCache& plan_cache() {
  static PlanCache* cache = new PlanCache;
  return *cache;
}

// The plan key of a product on these operands (without epilogue).
GemmKey gemm_key(int device, const GemmDesc& desc, const Tensor& a, const Tensor& b,
                 const Tensor& c) {
  const size_t ab_size = dtype_size(a.dtype()), c_size = dtype_size(c.dtype());
  return GemmKey{.device = device,
                 .ab = a.dtype(),
                 .c = c.dtype(),
                 .trans_a = desc.trans_a,
                 .trans_b = desc.trans_b,
                 .tf32 = a.dtype() == DType::F32 && tf32_allowed(),
                 .tuned = gemm_autotune_enabled(),
                 .m = desc.m,
                 .n = desc.n,
                 .k = desc.k,
                 .batch = desc.batch,
                 .stride_a = desc.batch > 1 ? desc.stride_a : 0,
                 .stride_b = desc.batch > 1 ? desc.stride_b : 0,
                 .stride_c = desc.batch > 1 ? desc.stride_c : 0,
                 .align_a = alignment(a.data(), desc.batch, desc.stride_a, ab_size),
                 .align_b = alignment(b.data(), desc.batch, desc.stride_b, ab_size),
                 .align_c = alignment(c.data(), desc.batch, desc.stride_c, c_size)};
}

// What one cuBLASLt call needs besides its plan and operands.
struct MatmulContext {
  cublasLtHandle_t handle;
  cudaStream_t stream;
  CachingAllocator& allocator;
};

// D = C: the plan's matmul on the row-major operands, in place on C; cuBLASLt's status.
// `site` names the backend primitive in the kernel profile.
cublasStatus_t try_matmul(const MatmulContext& ctx, const GemmPlan& plan, const GemmDesc& desc,
                          const Tensor& a, const Tensor& b, Tensor& c, const char* site) {
  const float alpha = desc.alpha, beta = desc.beta;
  Scratch workspace(ctx.allocator, plan.workspace);
  const void* lt_a_data = of_operand(plan.mapping.a.source, a.data(), b.data());
  const void* lt_b_data = of_operand(plan.mapping.b.source, a.data(), b.data());
  ProfiledLaunch timed(plan.label.c_str(), site, ctx.stream);
  const cublasStatus_t status =
      cublasLtMatmul(ctx.handle, plan.desc.get(), &alpha, lt_a_data, plan.lt_a.get(), lt_b_data,
                     plan.lt_b.get(), &beta, c.data(), plan.lt_c.get(), c.data(), plan.lt_c.get(),
                     &plan.algo, workspace.get(), plan.workspace, ctx.stream);
  if (status != CUBLAS_STATUS_SUCCESS) timed.cancel();  // nothing ran
  return status;
}

// try_matmul, any failure an error.
void run_matmul(const MatmulContext& ctx, const GemmPlan& plan, const GemmDesc& desc,
                const Tensor& a, const Tensor& b, Tensor& c, const char* site) {
  CUBLAS_CHECK(try_matmul(ctx, plan, desc, a, b, c, site));
}

}  // namespace

void CudaBackend::gemm(const GemmDesc& desc, const Tensor& a, const Tensor& b, Tensor& c) {
  backend_checks::gemm(device(), desc, a, b, c);
  if (desc.batch == 0 || desc.m == 0 || desc.n == 0) return;
  MIXPREC_CHECK(desc.batch <= INT32_MAX, "gemm: batch ", desc.batch,
                " exceeds cuBLASLt's limit of ", INT32_MAX, "; split the batch");
  use_device();

  const size_t c_size = dtype_size(c.dtype());
  if (desc.k == 0) {
    // An empty sum: C = beta * C (zeros when beta == 0, without reading C), as on the CPU.
    const int64_t mn = desc.m * desc.n;
    const bool dense = desc.batch == 1 || desc.stride_c == mn;
    const int64_t items = dense ? 1 : desc.batch;
    const int64_t count = dense ? span(desc.batch, desc.stride_c, mn) : mn;
    for (int64_t i = 0; i < items; ++i) {
      void* ci = static_cast<char*>(c.data()) + i * desc.stride_c * c_size;
      if (desc.beta == 0.0f) {
        CUDA_CHECK(cudaMemsetAsync(ci, 0, static_cast<size_t>(count) * c_size, stream_));
      } else {
        kernels::scale(c.dtype(), ci, desc.beta, ci, count, stream_);
      }
    }
    return;
  }

  const MatmulContext ctx{cublaslt_handle(), stream_, allocator_};
  const GemmKey key = gemm_key(device_index_, desc, a, b, c);
  const TuningCall call{a.data(), b.data(), c.data(), desc.alpha, desc.beta, stream_, allocator_};
  run_matmul(ctx, plan_cache().get(ctx.handle, key, call), desc, a, b, c, __PRETTY_FUNCTION__);
}

void CudaBackend::gemm_epilogue(const GemmDesc& desc, GemmEpilogue epilogue, const Tensor& a,
                                const Tensor& b, const Tensor* bias, Tensor& c,
                                Tensor* pre_gelu) {
  backend_checks::gemm_epilogue(device(), desc, epilogue, a, b, bias, c, pre_gelu);
  if (desc.m == 0 || desc.n == 0) return;
  use_device();
  const void* const bias_data = bias != nullptr ? bias->data() : nullptr;
  void* const pre = pre_gelu != nullptr ? pre_gelu->data() : nullptr;
  // cuBLASLt's own GELU only where a 16-bit rounding hides it, and only for rows that can be
  // the pre-GELU matrix's leading dimension (see the file comment).
  const bool gelu_fusable = c.dtype() != DType::F32 && desc.n % 8 == 0;
  if (desc.k > 0 && (!epilogue_has_gelu(epilogue) || gelu_fusable)) {
    const MatmulContext ctx{cublaslt_handle(), stream_, allocator_};
    GemmKey key = gemm_key(device_index_, desc, a, b, c);
    key.epilogue = epilogue;
    key.align_bias = bias_data != nullptr ? alignment(bias_data, 1, 0, 0) : 0;
    key.align_pre = pre != nullptr ? alignment(pre, 1, 0, 0) : 0;
    const TuningCall call{a.data(), b.data(), c.data(), desc.alpha, 0.0f, stream_, allocator_};
    GemmPlan& plan = plan_cache().get(ctx.handle, key, call, bias_data, pre);
    if (plan.available.load()) {
      const std::lock_guard<std::mutex> lock(plan.call_mutex);
      plan.point_epilogue(bias_data, pre);
      const cublasStatus_t status = try_matmul(ctx, plan, desc, a, b, c, __PRETTY_FUNCTION__);
      if (status == CUBLAS_STATUS_SUCCESS) return;
      // The heuristic offered an algorithm that the call refuses for these operands: this
      // problem takes the separate epilogue from now on. cuBLASLt says a heuristic's offer
      // does not guarantee that the algorithm runs (operand alignment, for one), and such a
      // refusal comes as NOT_SUPPORTED or INVALID_VALUE; the separate epilogue computes the
      // same. Any other failure is an error. INVALID_VALUE is also how cuBLASLt answers a
      // misuse, so the switch is said once per problem on standard error, with the status,
      // rather than shown only by the kernel profile.
      if (status != CUBLAS_STATUS_NOT_SUPPORTED && status != CUBLAS_STATUS_INVALID_VALUE)
        CUBLAS_CHECK(status);
      if (plan.available.exchange(false)) {
        std::fprintf(stderr,
                     "mixprec: cuBLASLt refused the fused epilogue of %s (%s); this problem "
                     "takes the separate epilogue kernel from now on\n",
                     plan.label.c_str(), cublasGetStatusName(status));
      }
    }
  }
  // No fused form: the FP32 sums (in C itself when it is F32), then the epilogue kernel.
  Tensor sums = c.dtype() == DType::F32 ? c : Tensor::empty({desc.m, desc.n}, DType::F32, device());
  gemm(desc, a, b, sums);
  kernels::gemm_epilogue(c.dtype(), sums.data_as<float>(), bias_data, c.data(), pre, desc.m,
                         desc.n, stream_);
}

}  // namespace mixprec
