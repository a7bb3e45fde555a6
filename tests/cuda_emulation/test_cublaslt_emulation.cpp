// The emulated cuBLASLt epilogues (cuda/emulation/cublaslt_emulation.cpp) against cuBLASLt's
// documented semantics, on column-major D of m rows: CUBLASLT_EPILOGUE_BIAS adds bias[row] to
// every column; CUBLASLT_EPILOGUE_GELU_AUX_BIAS also writes the biased sum, rounded to D's
// type, at aux[i + j * aux_ld] and stores GELU of the unrounded sum in D; GELU_AUX does so
// without a bias; DEFAULT adds no bias; and each refused descriptor gets the status the
// emulation documents, from the heuristic and the matmul alike. The data are dyadic, so every
// FP32 product and sum is exact and the references below need no tolerance. The emulated
// device memory is host memory, so the data live in host vectors.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include <cublasLt.h>

#include "core/half.h"
#include "core/math/elementwise.h"
#include "emulation_test_util.h"

namespace {

using emulation_test::kNaN;

// Not `half`: cuda_fp16.h, which cublasLt.h includes, declares one in the global namespace.
using F16 = mixprec::half;

// A (m x k) times B (k x n) into D (m x n), all packed column-major; C is D (beta 0).
class Matmul {
 public:
  Matmul(cudaDataType_t type, int64_t m, int64_t n, int64_t k, int32_t batch = 1)
      : Matmul(type, type, m, n, k, batch) {}
  Matmul(cudaDataType_t type, cudaDataType_t d_type, int64_t m, int64_t n, int64_t k,
         int32_t batch) {
    REQUIRE(cublasLtCreate(&handle_) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F) ==
            CUBLAS_STATUS_SUCCESS);
    layout(&a_, type, m, k, batch);
    layout(&b_, type, k, n, batch);
    layout(&d_, d_type, m, n, batch);
    REQUIRE(cublasLtMatmulPreferenceCreate(&pref_) == CUBLAS_STATUS_SUCCESS);
  }
  ~Matmul() {
    cublasLtMatmulPreferenceDestroy(pref_);
    for (cublasLtMatrixLayout_t l : {a_, b_, d_}) cublasLtMatrixLayoutDestroy(l);
    cublasLtMatmulDescDestroy(desc_);
    cublasLtDestroy(handle_);
  }
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;

  cublasStatus_t epilogue(uint32_t e) {
    return cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e);
  }
  void bias(const void* p) {
    REQUIRE(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p,
                                           sizeof p) == CUBLAS_STATUS_SUCCESS);
  }
  void aux(void* p, int64_t ld) {
    REQUIRE(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &p,
                                           sizeof p) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                           sizeof ld) == CUBLAS_STATUS_SUCCESS);
  }
  cublasLtMatmulDesc_t desc() const { return desc_; }

  cublasStatus_t heuristic() {
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    return cublasLtMatmulAlgoGetHeuristic(handle_, desc_, a_, b_, d_, d_, pref_, 1, &result,
                                          &found);
  }
  // D = A * B with the library's own choice of algorithm and no workspace.
  cublasStatus_t run(const void* a, const void* b, void* d) {
    const float alpha = 1.0f, beta = 0.0f;
    return cublasLtMatmul(handle_, desc_, &alpha, a, a_, b, b_, &beta, d, d_, d, d_, nullptr,
                          nullptr, 0, nullptr);
  }

 private:
  static void layout(cublasLtMatrixLayout_t* l, cudaDataType_t type, int64_t rows, int64_t cols,
                     int32_t batch) {
    REQUIRE(cublasLtMatrixLayoutCreate(l, type, rows, cols, rows) == CUBLAS_STATUS_SUCCESS);
    if (batch == 1) return;
    const int64_t stride = rows * cols;
    REQUIRE(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                             sizeof batch) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                             &stride, sizeof stride) == CUBLAS_STATUS_SUCCESS);
  }

  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
  cublasLtMatmulPreference_t pref_ = nullptr;
};

constexpr int64_t kM = 5, kN = 3, kK = 4;

// Operands in quarters and in multiples of 2^-10 within (-1, 1), both exact in FP16: their
// products are multiples of 2^-12, so sums of four reach 14 significant bits, exact in FP32
// but not always in FP16. The bias is in eighths.
std::vector<float> operand_a() {
  std::vector<float> a(kM * kK);
  for (int64_t i = 0; i < kM; ++i)
    for (int64_t q = 0; q < kK; ++q) a[i + q * kM] = float((i * 7 + q * 3) % 9 - 4) / 4.0f;
  return a;
}

std::vector<float> operand_b() {
  std::vector<float> b(kK * kN);
  for (int64_t q = 0; q < kK; ++q)
    for (int64_t j = 0; j < kN; ++j)
      b[q + j * kK] = float((q * 397 + j * 911) % 2047 - 1023) / 1024.0f;
  return b;
}

std::vector<float> bias_vector() {
  std::vector<float> bias(kM);
  for (int64_t i = 0; i < kM; ++i) bias[i] = float(i * 3 % 8 - 4) / 8.0f;
  return bias;
}

// sum(i, j) = (A B)(i, j) + bias[i], accumulated in double: exact for these data, so equal to
// the FP32 sum of any order.
std::vector<float> biased_sum(const std::vector<float>& a, const std::vector<float>& b,
                              const std::vector<float>& bias) {
  std::vector<float> sum(kM * kN);
  for (int64_t j = 0; j < kN; ++j)
    for (int64_t i = 0; i < kM; ++i) {
      double s = bias[i];
      for (int64_t q = 0; q < kK; ++q) s += double(a[i + q * kM]) * double(b[q + j * kK]);
      sum[i + j * kM] = float(s);
    }
  return sum;
}

template <class T>
std::vector<T> as(const std::vector<float>& v) {
  std::vector<T> out;
  for (float x : v) out.push_back(T(x));
  return out;
}

template <class T>
constexpr cudaDataType_t type_of() {
  return sizeof(T) == 4 ? CUDA_R_32F : CUDA_R_16F;
}

template <class T>
void check_bias() {
  const std::vector<float> a = operand_a(), b = operand_b(), bias = bias_vector();
  const std::vector<float> sum = biased_sum(a, b, bias);
  const std::vector<T> da = as<T>(a), db = as<T>(b), dbias = as<T>(bias);
  std::vector<T> d = as<T>(std::vector<float>(kM * kN, kNaN));
  Matmul mm(type_of<T>(), kM, kN, kK);
  REQUIRE(mm.epilogue(CUBLASLT_EPILOGUE_BIAS) == CUBLAS_STATUS_SUCCESS);
  mm.bias(dbias.data());
  REQUIRE(mm.heuristic() == CUBLAS_STATUS_SUCCESS);
  REQUIRE(mm.run(da.data(), db.data(), d.data()) == CUBLAS_STATUS_SUCCESS);
  for (int64_t j = 0; j < kN; ++j)
    for (int64_t i = 0; i < kM; ++i) {
      INFO("row " << i << ", column " << j);
      CHECK(float(d[i + j * kM]) == float(T(sum[i + j * kM])));
    }
}

// D and aux of a GELU_AUX_BIAS matmul in T's type, from NaN-filled buffers (aux with
// leading dimension aux_ld), after a successful heuristic and run.
template <class T>
std::pair<std::vector<T>, std::vector<T>> run_gelu_aux_bias(const std::vector<float>& a,
                                                            const std::vector<float>& b,
                                                            const std::vector<float>& bias,
                                                            int64_t aux_ld) {
  const std::vector<T> da = as<T>(a), db = as<T>(b), dbias = as<T>(bias);
  std::vector<T> d = as<T>(std::vector<float>(kM * kN, kNaN));
  std::vector<T> aux = as<T>(std::vector<float>(aux_ld * kN, kNaN));
  Matmul mm(type_of<T>(), kM, kN, kK);
  REQUIRE(mm.epilogue(CUBLASLT_EPILOGUE_GELU_AUX_BIAS) == CUBLAS_STATUS_SUCCESS);
  mm.bias(dbias.data());
  mm.aux(aux.data(), aux_ld);
  REQUIRE(mm.heuristic() == CUBLAS_STATUS_SUCCESS);
  REQUIRE(mm.run(da.data(), db.data(), d.data()) == CUBLAS_STATUS_SUCCESS);
  return {d, aux};
}

}  // namespace

TEST_CASE("emulated cuBLASLt BIAS epilogue adds bias[row] to every column of D",
          "[cuda_emulation]") {
  SECTION("F32") { check_bias<float>(); }
  SECTION("F16") { check_bias<F16>(); }
}

TEST_CASE("emulated cuBLASLt DEFAULT epilogue adds no bias even with a bias pointer set",
          "[cuda_emulation]") {
  // DEFAULT is "no special postprocessing"; the bias pointer belongs to the bias epilogues.
  const std::vector<float> a = operand_a(), b = operand_b(), bias = bias_vector();
  const std::vector<float> product = biased_sum(a, b, std::vector<float>(kM, 0.0f));
  std::vector<float> d(kM * kN, kNaN);
  Matmul mm(CUDA_R_32F, kM, kN, kK);
  mm.bias(bias.data());
  REQUIRE(mm.run(a.data(), b.data(), d.data()) == CUBLAS_STATUS_SUCCESS);
  CHECK(d == product);
  // Back to DEFAULT after BIAS on the same descriptor.
  REQUIRE(mm.epilogue(CUBLASLT_EPILOGUE_BIAS) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(mm.run(a.data(), b.data(), d.data()) == CUBLAS_STATUS_SUCCESS);
  CHECK(d == biased_sum(a, b, bias));
  REQUIRE(mm.epilogue(CUBLASLT_EPILOGUE_DEFAULT) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(mm.run(a.data(), b.data(), d.data()) == CUBLAS_STATUS_SUCCESS);
  CHECK(d == product);
}

TEST_CASE("emulated cuBLASLt GELU_AUX_BIAS epilogue stores the biased sum in aux and GELU in D",
          "[cuda_emulation]") {
  const std::vector<float> a = operand_a(), b = operand_b(), bias = bias_vector();
  const std::vector<float> sum = biased_sum(a, b, bias);
  // aux_ld 8 for 5 rows: rows 5..7 of each aux column are not the matrix and keep their NaN.
  constexpr int64_t kAuxLd = 8;

  SECTION("F32") {
    const auto [d, aux] = run_gelu_aux_bias<float>(a, b, bias, kAuxLd);
    for (int64_t j = 0; j < kN; ++j) {
      for (int64_t i = 0; i < kM; ++i) {
        INFO("row " << i << ", column " << j);
        CHECK(aux[i + j * kAuxLd] == sum[i + j * kM]);
        CHECK(d[i + j * kM] == mixprec::gelu_tanh(sum[i + j * kM]));
      }
      for (int64_t i = kM; i < kAuxLd; ++i) CHECK(std::isnan(aux[i + j * kAuxLd]));
    }
  }

  SECTION("F16: aux rounds the sum once, GELU reads the unrounded sum") {
    // The data must tell the two orders apart: some sums are inexact in FP16, and for some
    // GELU of the rounded sum rounds to another FP16 value than GELU of the exact sum.
    int inexact = 0, order_matters = 0;
    for (float s : sum) {
      inexact += float(F16(s)) != s;
      order_matters += float(F16(mixprec::gelu_tanh(s))) !=
                       float(F16(mixprec::gelu_tanh(float(F16(s)))));
    }
    REQUIRE(inexact > 0);
    REQUIRE(order_matters > 0);

    const auto [d, aux] = run_gelu_aux_bias<F16>(a, b, bias, kAuxLd);
    for (int64_t j = 0; j < kN; ++j) {
      for (int64_t i = 0; i < kM; ++i) {
        const float s = sum[i + j * kM];
        INFO("row " << i << ", column " << j << ", sum " << s);
        CHECK(aux[i + j * kAuxLd].bits == F16(s).bits);
        CHECK(d[i + j * kM].bits == F16(mixprec::gelu_tanh(s)).bits);
      }
      for (int64_t i = kM; i < kAuxLd; ++i) CHECK(std::isnan(float(aux[i + j * kAuxLd])));
    }
  }
}

TEST_CASE("emulated cuBLASLt GELU_AUX epilogue stores the sum in aux and GELU in D, no bias",
          "[cuda_emulation]") {
  const std::vector<float> a = operand_a(), b = operand_b();
  const std::vector<float> sum = biased_sum(a, b, std::vector<float>(kM, 0.0f));
  const std::vector<float> bias = bias_vector();
  std::vector<float> d(kM * kN, kNaN), aux(8 * kN, kNaN);
  Matmul mm(CUDA_R_32F, kM, kN, kK);
  REQUIRE(mm.epilogue(CUBLASLT_EPILOGUE_GELU_AUX) == CUBLAS_STATUS_SUCCESS);
  mm.aux(aux.data(), 8);
  REQUIRE(mm.heuristic() == CUBLAS_STATUS_SUCCESS);  // no bias pointer needed
  mm.bias(bias.data());                               // and one set is not read
  REQUIRE(mm.run(a.data(), b.data(), d.data()) == CUBLAS_STATUS_SUCCESS);
  for (int64_t j = 0; j < kN; ++j)
    for (int64_t i = 0; i < kM; ++i) {
      INFO("row " << i << ", column " << j);
      CHECK(aux[i + j * 8] == sum[i + j * kM]);
      CHECK(d[i + j * kM] == mixprec::gelu_tanh(sum[i + j * kM]));
    }
  mm.aux(nullptr, 8);
  CHECK(mm.heuristic() == CUBLAS_STATUS_INVALID_VALUE);
}

TEST_CASE("emulated cuBLASLt refuses epilogues without their pointers or a valid aux_ld",
          "[cuda_emulation]") {
  const std::vector<float> a = operand_a(), b = operand_b(), bias = bias_vector();
  std::vector<float> d(kM * kN), aux(16 * kN);
  // Each refusal from the heuristic and from the matmul alike.
  const auto status = [&](Matmul& mm) {
    const cublasStatus_t from_heuristic = mm.heuristic();
    CHECK(mm.run(a.data(), b.data(), d.data()) == from_heuristic);
    return from_heuristic;
  };

  SECTION("no bias pointer") {
    for (uint32_t e : {CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_GELU_AUX_BIAS}) {
      INFO("epilogue " << e);
      Matmul mm(CUDA_R_32F, kM, kN, kK);
      REQUIRE(mm.epilogue(e) == CUBLAS_STATUS_SUCCESS);
      mm.aux(aux.data(), 8);
      CHECK(status(mm) == CUBLAS_STATUS_INVALID_VALUE);
      mm.bias(bias.data());
      CHECK(status(mm) == CUBLAS_STATUS_SUCCESS);
      mm.bias(nullptr);
      CHECK(status(mm) == CUBLAS_STATUS_INVALID_VALUE);
    }
  }

  SECTION("GELU_AUX_BIAS without aux, or with aux_ld not a multiple of 8 or below D's rows") {
    Matmul mm(CUDA_R_32F, kM, kN, kK);
    REQUIRE(mm.epilogue(CUBLASLT_EPILOGUE_GELU_AUX_BIAS) == CUBLAS_STATUS_SUCCESS);
    mm.bias(bias.data());
    CHECK(status(mm) == CUBLAS_STATUS_INVALID_VALUE);  // neither aux pointer nor aux_ld
    mm.aux(nullptr, 8);
    CHECK(status(mm) == CUBLAS_STATUS_INVALID_VALUE);
    mm.aux(aux.data(), 8);
    CHECK(status(mm) == CUBLAS_STATUS_SUCCESS);
    mm.aux(aux.data(), 12);  // >= 5 rows, not a multiple of 8
    CHECK(status(mm) == CUBLAS_STATUS_INVALID_VALUE);
    mm.aux(aux.data(), kM);  // exactly the rows, not a multiple of 8
    CHECK(status(mm) == CUBLAS_STATUS_INVALID_VALUE);
    mm.aux(aux.data(), 0);  // a multiple of 8, below the rows
    CHECK(status(mm) == CUBLAS_STATUS_INVALID_VALUE);
    mm.aux(aux.data(), 16);
    CHECK(status(mm) == CUBLAS_STATUS_SUCCESS);
  }

  SECTION("aux_ld 8 below 9 rows of D") {
    std::vector<float> a9(9 * kK, 0.0f), bias9(9, 0.0f), d9(9 * kN), aux9(16 * kN);
    Matmul mm(CUDA_R_32F, 9, kN, kK);
    REQUIRE(mm.epilogue(CUBLASLT_EPILOGUE_GELU_AUX_BIAS) == CUBLAS_STATUS_SUCCESS);
    mm.bias(bias9.data());
    mm.aux(aux9.data(), 8);
    CHECK(mm.heuristic() == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(mm.run(a9.data(), b.data(), d9.data()) == CUBLAS_STATUS_INVALID_VALUE);
    mm.aux(aux9.data(), 16);
    CHECK(mm.heuristic() == CUBLAS_STATUS_SUCCESS);
    CHECK(mm.run(a9.data(), b.data(), d9.data()) == CUBLAS_STATUS_SUCCESS);
  }
}

TEST_CASE("emulated cuBLASLt refuses the epilogues and epilogue uses the backend does not make",
          "[cuda_emulation]") {
  const std::vector<float> bias = bias_vector();
  std::vector<float> aux(8 * kN);

  SECTION("other epilogue values, when set; the descriptor keeps its epilogue") {
    const std::vector<float> a = operand_a(), b = operand_b();
    std::vector<float> d(kM * kN, kNaN);
    Matmul mm(CUDA_R_32F, kM, kN, kK);
    mm.bias(bias.data());
    for (uint32_t e : {CUBLASLT_EPILOGUE_RELU, CUBLASLT_EPILOGUE_RELU_BIAS, CUBLASLT_EPILOGUE_GELU,
                       CUBLASLT_EPILOGUE_GELU_BIAS, CUBLASLT_EPILOGUE_DGELU_BGRAD,
                       CUBLASLT_EPILOGUE_BGRADB}) {
      INFO("epilogue " << e);
      CHECK(mm.epilogue(e) == CUBLAS_STATUS_NOT_SUPPORTED);
    }
    REQUIRE(mm.run(a.data(), b.data(), d.data()) == CUBLAS_STATUS_SUCCESS);
    CHECK(d == biased_sum(a, b, std::vector<float>(kM, 0.0f)));
    // The attribute is a uint32_t; another size is an invalid value.
    const uint64_t wide = CUBLASLT_EPILOGUE_BIAS;
    CHECK(cublasLtMatmulDescSetAttribute(mm.desc(), CUBLASLT_MATMUL_DESC_EPILOGUE, &wide,
                                         sizeof wide) == CUBLAS_STATUS_INVALID_VALUE);
  }

  SECTION("an epilogue with batch 2") {
    std::vector<float> a(2 * kM * kK, 1.0f), b(2 * kK * kN, 1.0f), d(2 * kM * kN);
    for (uint32_t e : {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BIAS,
                       CUBLASLT_EPILOGUE_GELU_AUX_BIAS}) {
      INFO("epilogue " << e);
      Matmul mm(CUDA_R_32F, kM, kN, kK, 2);
      REQUIRE(mm.epilogue(e) == CUBLAS_STATUS_SUCCESS);
      mm.bias(bias.data());
      mm.aux(aux.data(), 8);
      const cublasStatus_t expected =
          e == CUBLASLT_EPILOGUE_DEFAULT ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
      CHECK(mm.heuristic() == expected);
      CHECK(mm.run(a.data(), b.data(), d.data()) == expected);
    }
  }

  SECTION("an epilogue with 16-bit operands into an F32 D") {
    const std::vector<F16> a = as<F16>(operand_a()), b = as<F16>(operand_b());
    std::vector<float> d(kM * kN);
    for (uint32_t e : {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BIAS,
                       CUBLASLT_EPILOGUE_GELU_AUX_BIAS}) {
      INFO("epilogue " << e);
      Matmul mm(CUDA_R_16F, CUDA_R_32F, kM, kN, kK, 1);
      REQUIRE(mm.epilogue(e) == CUBLAS_STATUS_SUCCESS);
      mm.bias(bias.data());
      mm.aux(aux.data(), 8);
      const cublasStatus_t expected =
          e == CUBLASLT_EPILOGUE_DEFAULT ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
      CHECK(mm.heuristic() == expected);
      CHECK(mm.run(a.data(), b.data(), d.data()) == expected);
    }
  }
}
