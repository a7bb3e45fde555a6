// cuBLASLt's matrix multiply for the emulated backend, on the host, with the semantics that
// cuda/cuda_gemm.cpp relies on (cuBLASLt documentation):
//   D = alpha * op(A) * op(B) + beta * C, column-major layouts of rows x cols with a leading
//   dimension, op() from the descriptor's TRANSA / TRANSB, batches of BATCH_COUNT matrices
//   STRIDED_BATCH_OFFSET elements apart, alpha and beta host floats (scale type 32F), FP32
//   accumulation (inputs first rounded to TF32 under CUBLAS_COMPUTE_32F_FAST_TF32), one
//   rounding to D's type, and C not read when beta is 0.
// Three epilogues, for batch 1 with D of A's type: CUBLASLT_EPILOGUE_BIAS adds bias[row] (D's
// type, one per row of D) before the rounding; CUBLASLT_EPILOGUE_GELU_AUX writes the sum,
// rounded to D's type, to the aux matrix and stores GELU (tanh form) of the unrounded sum in
// D; CUBLASLT_EPILOGUE_GELU_AUX_BIAS does both, GELU and aux taking the biased sum. Setting
// any other epilogue is CUBLAS_STATUS_NOT_SUPPORTED.
// Only the attributes the backend sets are accepted; any other is CUBLAS_STATUS_NOT_SUPPORTED,
// so that new use of the library is emulated on purpose rather than ignored. Shapes, types
// and leading dimensions are checked as the library documents them, so a layout the backend
// gets wrong fails here with CUBLAS_STATUS_INVALID_VALUE or NOT_SUPPORTED as on a GPU.
//
// The heuristic offers up to kEmulatedAlgorithms algorithms (as many as asked for), told
// apart by the algo's first word and needing different workspaces, so that the backend's
// autotuner (cuda/gemm_autotune.h) has several to time; all compute the same result. A
// matmul checks, as cuBLASLt does, that its algo came from the heuristic and that the
// workspace passed is at least the algo's. The autotuner times them with the runtime's
// events, which runtime_emulation.cpp emulates.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/half.h"
#include "core/math/elementwise.h"
#include "cuda/emulation/runtime_emulation.h"
#include "cuda/emulation/stream_capture.h"
#include "cuda/emulation/tf32.h"

struct cublasLtContext {
  int live = 1;
};

namespace {

struct MatmulDesc {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  int32_t trans_a = CUBLAS_OP_N;
  int32_t trans_b = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  void* aux = nullptr;
  int64_t aux_ld = 0;
};

struct Layout {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch = 1;
  int64_t stride = 0;
};

struct Preference {
  uint64_t max_workspace = 0;
};

// The emulated algorithms: algo.data[0] is kAlgoTag + index, algo.data[1] the workspace bytes
// the algorithm needs (kAlgoWorkspace[index]).
constexpr int kEmulatedAlgorithms = 3;
constexpr uint64_t kAlgoTag = 0x6D69787072000000;  // "mixpr"
constexpr uint64_t kAlgoWorkspace[kEmulatedAlgorithms] = {0, 4096, 65536};

template <class To, class From>
To* as(From* p) {
  return reinterpret_cast<To*>(p);
}

template <class V>
cublasStatus_t read_value(const void* buf, size_t bytes, V& out) {
  if (buf == nullptr || bytes != sizeof(V)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(&out, buf, sizeof(V));
  return CUBLAS_STATUS_SUCCESS;
}

bool floating(cudaDataType_t t) { return t == CUDA_R_32F || t == CUDA_R_16F || t == CUDA_R_16BF; }

float load(cudaDataType_t type, const void* base, int64_t index) {
  switch (type) {
    case CUDA_R_16F: return float(static_cast<const mixprec::half*>(base)[index]);
    case CUDA_R_16BF: return float(static_cast<const mixprec::bfloat16*>(base)[index]);
    default: return static_cast<const float*>(base)[index];
  }
}

void store(cudaDataType_t type, void* base, int64_t index, float value) {
  switch (type) {
    case CUDA_R_16F: static_cast<mixprec::half*>(base)[index] = mixprec::half(value); break;
    case CUDA_R_16BF: static_cast<mixprec::bfloat16*>(base)[index] = mixprec::bfloat16(value); break;
    default: static_cast<float*>(base)[index] = value;
  }
}

using mixprec::emulation::to_tf32;

// The problem of a descriptor and four layouts, or a status saying why there is none.
struct Problem {
  int64_t m = 0, n = 0, k = 0;
  int32_t batch = 1;
};

cublasStatus_t validate(const MatmulDesc* desc, const Layout* a, const Layout* b, const Layout* c,
                        const Layout* d, Problem& out) {
  if (desc == nullptr || a == nullptr || b == nullptr || c == nullptr || d == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (desc->scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (desc->compute != CUBLAS_COMPUTE_32F && desc->compute != CUBLAS_COMPUTE_32F_FAST_TF32)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (!floating(a->type) || a->type != b->type || c->type != d->type || !floating(c->type))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  // FP32 operands only into FP32; FP16/BF16 operands into their own type or FP32.
  if (a->type == CUDA_R_32F ? c->type != CUDA_R_32F : (c->type != a->type && c->type != CUDA_R_32F))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (desc->compute == CUBLAS_COMPUTE_32F_FAST_TF32 && a->type != CUDA_R_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool ta = desc->trans_a != CUBLAS_OP_N, tb = desc->trans_b != CUBLAS_OP_N;
  const auto m = static_cast<int64_t>(c->rows), n = static_cast<int64_t>(c->cols);
  const auto k = static_cast<int64_t>(ta ? a->rows : a->cols);
  if (static_cast<int64_t>(ta ? a->cols : a->rows) != m) return CUBLAS_STATUS_INVALID_VALUE;
  if (static_cast<int64_t>(tb ? b->cols : b->rows) != k) return CUBLAS_STATUS_INVALID_VALUE;
  if (static_cast<int64_t>(tb ? b->rows : b->cols) != n) return CUBLAS_STATUS_INVALID_VALUE;
  if (d->rows != c->rows || d->cols != c->cols || d->ld != c->ld) return CUBLAS_STATUS_INVALID_VALUE;
  for (const Layout* l : {a, b, c}) {
    if (l->ld < static_cast<int64_t>(l->rows) || l->ld < 1) return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (a->batch != c->batch || b->batch != c->batch || d->batch != c->batch ||
      d->stride != c->stride)
    return CUBLAS_STATUS_INVALID_VALUE;
  // The epilogues only as the backend uses them: one matrix, and D (so the bias and aux,
  // whose type defaults to D's) of A's type; any other use is refused rather than guessed at.
  if (desc->epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    if (d->type != a->type || c->batch != 1) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (desc->epilogue != CUBLASLT_EPILOGUE_GELU_AUX && desc->bias == nullptr)
      return CUBLAS_STATUS_INVALID_VALUE;
    if (desc->epilogue != CUBLASLT_EPILOGUE_BIAS &&
        (desc->aux == nullptr || desc->aux_ld < m || desc->aux_ld % 8 != 0))
      return CUBLAS_STATUS_INVALID_VALUE;
  }
  out = {m, n, k, c->batch};
  return CUBLAS_STATUS_SUCCESS;
}

// D = alpha * op(A) op(B) + beta * C (and the epilogue), for a call that validate() accepted.
// The descriptors come by value: a captured matmul (stream_capture.h) runs with the values
// they had when it was captured, as cuBLASLt bakes them into the kernels it queues.
void multiply(const MatmulDesc& desc, const Layout& la, const Layout& lb, const Layout& lc,
              const Problem& p, float alpha_v, float beta_v, const void* a, const void* b,
              const void* c, void* d) {
  const bool ta = desc.trans_a != CUBLAS_OP_N, tb = desc.trans_b != CUBLAS_OP_N;
  const bool tf32 = desc.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  const bool bias = desc.epilogue == CUBLASLT_EPILOGUE_BIAS ||
                    desc.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool gelu = desc.epilogue == CUBLASLT_EPILOGUE_GELU_AUX ||
                    desc.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const auto operand = [&](const Layout& l, const void* base, int64_t offset, int64_t index) {
    const float v = load(l.type, base, offset + index);
    return tf32 ? to_tf32(v) : v;
  };
  // op(A) as m rows of k and op(B) transposed as n rows of k, in FP32, so that every dot
  // product below walks contiguous memory; the sum runs over k in order.
  std::vector<float> rows_a(static_cast<size_t>(p.m * p.k)), rows_b(static_cast<size_t>(p.n * p.k));
  for (int32_t batch = 0; batch < p.batch; ++batch) {
    const int64_t oa = batch * la.stride, ob = batch * lb.stride, oc = batch * lc.stride;
    for (int64_t i = 0; i < p.m; ++i)
      for (int64_t q = 0; q < p.k; ++q)
        rows_a[i * p.k + q] = operand(la, a, oa, ta ? q + i * la.ld : i + q * la.ld);
    for (int64_t j = 0; j < p.n; ++j)
      for (int64_t q = 0; q < p.k; ++q)
        rows_b[j * p.k + q] = operand(lb, b, ob, tb ? j + q * lb.ld : q + j * lb.ld);
    for (int64_t j = 0; j < p.n; ++j) {
      const float* y = &rows_b[j * p.k];
      for (int64_t i = 0; i < p.m; ++i) {
        const float* x = &rows_a[i * p.k];
        float acc = 0.0f;
        for (int64_t q = 0; q < p.k; ++q) acc += x[q] * y[q];
        const int64_t at = oc + i + j * lc.ld;
        float value = alpha_v * acc;
        if (beta_v != 0.0f) value += beta_v * load(lc.type, c, at);
        // Epilogues run with batch 1 only (validate), so row i of the bias and aux's
        // (i, j) need no batch offset. GELU takes the sum before its one rounding.
        if (bias) value += load(lc.type, desc.bias, i);
        if (gelu) {
          store(lc.type, desc.aux, i + j * desc.aux_ld, value);
          value = mixprec::gelu_tanh(value);
        }
        store(lc.type, d, at, value);
      }
    }
  }
}

}  // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *desc = as<cublasLtMatmulDescOpaque_t>(new MatmulDesc{compute, scale});
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete as<MatmulDesc>(desc);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t bytes) {
  auto* d = as<MatmulDesc>(desc);
  if (d == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: return read_value(buf, bytes, d->trans_a);
    case CUBLASLT_MATMUL_DESC_TRANSB: return read_value(buf, bytes, d->trans_b);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: {
      // Refused here rather than at the matmul, so that a descriptor never holds an
      // epilogue the emulation cannot compute.
      uint32_t epilogue = 0;
      const cublasStatus_t status = read_value(buf, bytes, epilogue);
      if (status != CUBLAS_STATUS_SUCCESS) return status;
      if (epilogue != CUBLASLT_EPILOGUE_DEFAULT && epilogue != CUBLASLT_EPILOGUE_BIAS &&
          epilogue != CUBLASLT_EPILOGUE_GELU_AUX && epilogue != CUBLASLT_EPILOGUE_GELU_AUX_BIAS)
        return CUBLAS_STATUS_NOT_SUPPORTED;
      d->epilogue = epilogue;
      return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return read_value(buf, bytes, d->bias);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return read_value(buf, bytes, d->aux);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return read_value(buf, bytes, d->aux_ld);
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if (layout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *layout = as<cublasLtMatrixLayoutOpaque_t>(new Layout{type, rows, cols, ld});
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete as<Layout>(layout);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t bytes) {
  auto* l = as<Layout>(layout);
  if (l == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return read_value(buf, bytes, l->batch);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return read_value(buf, bytes, l->stride);
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *pref = as<cublasLtMatmulPreferenceOpaque_t>(new Preference);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete as<Preference>(pref);
  return CUBLAS_STATUS_SUCCESS;
}

// Alignments and the reduction scheme only narrow the algorithms a GPU may choose; the host
// computation has one, so they are recorded as accepted.
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t bytes) {
  auto* p = as<Preference>(pref);
  if (p == nullptr || buf == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return read_value(buf, bytes, p->max_workspace);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
      return bytes == sizeof(uint32_t) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int* found) {
  if (handle == nullptr || pref == nullptr || results == nullptr || found == nullptr || requested < 1)
    return CUBLAS_STATUS_INVALID_VALUE;
  Problem problem;
  const cublasStatus_t status =
      validate(as<MatmulDesc>(desc), as<Layout>(a), as<Layout>(b), as<Layout>(c), as<Layout>(d), problem);
  *found = 0;
  if (status != CUBLAS_STATUS_SUCCESS) return status;
  const uint64_t max_workspace = as<Preference>(pref)->max_workspace;
  for (int index = 0; index < kEmulatedAlgorithms && *found < requested; ++index) {
    if (kAlgoWorkspace[index] > max_workspace) continue;
    cublasLtMatmulHeuristicResult_t& result = results[*found];
    std::memset(&result, 0, sizeof result);
    result.algo.data[0] = kAlgoTag + static_cast<uint64_t>(index);
    result.algo.data[1] = kAlgoWorkspace[index];
    result.workspaceSize = kAlgoWorkspace[index];
    result.state = CUBLAS_STATUS_SUCCESS;
    result.wavesCount = 1.0f;
    ++*found;
  }
  return *found > 0 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t compute_desc,
                              const void* alpha, const void* a, cublasLtMatrixLayout_t a_desc,
                              const void* b, cublasLtMatrixLayout_t b_desc, const void* beta,
                              const void* c, cublasLtMatrixLayout_t c_desc, void* d,
                              cublasLtMatrixLayout_t d_desc, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (handle == nullptr || alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  // No algo: the library chooses one that needs no workspace. Otherwise one of the
  // heuristic's, with at least its workspace.
  if (algo != nullptr) {
    const uint64_t index = algo->data[0] - kAlgoTag;
    if (index >= kEmulatedAlgorithms || algo->data[1] != kAlgoWorkspace[index])
      return CUBLAS_STATUS_INVALID_VALUE;
    if (workspace_bytes < algo->data[1] || (algo->data[1] > 0 && workspace == nullptr))
      return CUBLAS_STATUS_INVALID_VALUE;
  }
  const auto* desc = as<MatmulDesc>(compute_desc);
  const auto *la = as<Layout>(a_desc), *lb = as<Layout>(b_desc), *lc = as<Layout>(c_desc);
  Problem p;
  const cublasStatus_t status = validate(desc, la, lb, lc, as<Layout>(d_desc), p);
  if (status != CUBLAS_STATUS_SUCCESS) return status;
  const int refusal = mixprec::emulation::refuse_epilogue_matmuls();
  if (desc->epilogue != CUBLASLT_EPILOGUE_DEFAULT && refusal != CUBLAS_STATUS_SUCCESS) {
    mixprec::emulation::count_refused_epilogue_matmul();
    return static_cast<cublasStatus_t>(refusal);
  }
  const float alpha_v = *static_cast<const float*>(alpha), beta_v = *static_cast<const float*>(beta);
  const cudaError_t queued = mixprec::emulation::enqueue(
      stream, [desc = *desc, la = *la, lb = *lb, lc = *lc, p, alpha_v, beta_v, a, b, c, d] {
        if (!mixprec::emulation::host_only())
          multiply(desc, la, lb, lc, p, alpha_v, beta_v, a, b, c, d);
      });
  if (queued != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
  return CUBLAS_STATUS_SUCCESS;
}

// From cuBLAS itself (cuda_check.cpp and device_query.cpp name them).
const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_UNKNOWN";
  }
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_ALLOC_FAILED: return "resource allocation failed";
    default: return "an unknown error";
  }
}

cublasStatus_t cublasGetProperty(libraryPropertyType type, int* value) {
  if (value == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (type) {
    case MAJOR_VERSION: *value = CUBLAS_VER_MAJOR; break;
    case MINOR_VERSION: *value = CUBLAS_VER_MINOR; break;
    case PATCH_LEVEL: *value = CUBLAS_VER_PATCH; break;
    default: return CUBLAS_STATUS_INVALID_VALUE;
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
