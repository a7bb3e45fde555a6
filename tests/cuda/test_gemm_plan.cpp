// The row-major to column-major mapping of the CUDA GEMM (cuda/gemm_plan.h), checked without
// a device: a column-major matmul that follows cuBLAS's documented semantics is driven by the
// mapping on host arrays and must reproduce GemmDesc's row-major contract (core/backend.h).
// Operands are small integers, so every sum is exact and results compare bit for bit.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <vector>

#include "core/backend.h"
#include "cuda/gemm_plan.h"

namespace {

using namespace mixprec;

int64_t span(int64_t batch, int64_t stride, int64_t matrix) {
  return (batch - 1) * stride + matrix;
}

// C[p] = alpha * op(A[p]) @ op(B[p]) + beta * C[p], row-major, as core/backend.h states it.
void row_major_reference(const GemmDesc& d, const std::vector<float>& a,
                         const std::vector<float>& b, std::vector<float>& c) {
  for (int64_t p = 0; p < d.batch; ++p) {
    const float* ap = a.data() + p * d.stride_a;
    const float* bp = b.data() + p * d.stride_b;
    float* cp = c.data() + p * d.stride_c;
    for (int64_t i = 0; i < d.m; ++i) {
      for (int64_t j = 0; j < d.n; ++j) {
        float sum = 0.0f;
        for (int64_t l = 0; l < d.k; ++l) {
          const float x = d.trans_a ? ap[l * d.m + i] : ap[i * d.k + l];
          const float y = d.trans_b ? bp[j * d.k + l] : bp[l * d.n + j];
          sum += x * y;
        }
        float& out = cp[i * d.n + j];
        out = d.beta == 0.0f ? d.alpha * sum : d.alpha * sum + d.beta * out;
      }
    }
  }
}

// Element (i, j) of column-major matrix `index` of a batch: data[index * stride + i + j * ld].
float column_major_at(const std::vector<float>& data, const LtMatrixLayout& l, int64_t index,
                      int64_t i, int64_t j) {
  REQUIRE(i >= 0);
  REQUIRE(i < l.rows);
  REQUIRE(j >= 0);
  REQUIRE(j < l.cols);
  const int64_t at = index * l.stride + i + j * l.ld;
  REQUIRE(at < static_cast<int64_t>(data.size()));
  return data[static_cast<size_t>(at)];
}

// op(X) element (i, j): X itself for CUBLAS_OP_N, its transpose for CUBLAS_OP_T.
float op_at(const std::vector<float>& data, const LtInput& in, int64_t index, int64_t i,
            int64_t j) {
  return in.transpose ? column_major_at(data, in.layout, index, j, i)
                      : column_major_at(data, in.layout, index, i, j);
}

int64_t op_rows(const LtInput& in) { return in.transpose ? in.layout.cols : in.layout.rows; }
int64_t op_cols(const LtInput& in) { return in.transpose ? in.layout.rows : in.layout.cols; }

// cuBLAS's column-major matmul, D = alpha * op(A) @ op(B) + beta * C with op(A) m x k,
// op(B) k x n and C, D m x n, reading each input from the row-major operand the mapping
// names. The sizes come from the layouts alone, and must agree as cuBLASLt requires.
void column_major_matmul(const LtGemmMapping& map, const std::vector<float>& a,
                         const std::vector<float>& b, float alpha, float beta,
                         std::vector<float>& c) {
  const std::vector<float>& lt_a = map.a.source == GemmOperand::A ? a : b;
  const std::vector<float>& lt_b = map.b.source == GemmOperand::A ? a : b;
  const int64_t m = map.c.rows, n = map.c.cols, k = op_cols(map.a);
  REQUIRE(op_rows(map.a) == m);
  REQUIRE(op_rows(map.b) == k);
  REQUIRE(op_cols(map.b) == n);
  for (const LtMatrixLayout* l : {&map.a.layout, &map.b.layout, &map.c}) {
    REQUIRE(l->rows >= 1);
    REQUIRE(l->cols >= 1);
    REQUIRE(l->ld >= l->rows);
    REQUIRE(l->stride >= 0);
  }
  for (int64_t p = 0; p < map.batch; ++p) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        float sum = 0.0f;
        for (int64_t l = 0; l < k; ++l) {
          sum += op_at(lt_a, map.a, p, i, l) * op_at(lt_b, map.b, p, l, j);
        }
        const int64_t at = p * map.c.stride + i + j * map.c.ld;
        REQUIRE(at < static_cast<int64_t>(c.size()));
        float& out = c[static_cast<size_t>(at)];
        out = beta == 0.0f ? alpha * sum : alpha * sum + beta * out;
      }
    }
  }
}

std::vector<float> random_integers(std::mt19937& rng, int64_t count) {
  std::uniform_int_distribution<int> value(-4, 4);
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) x = static_cast<float>(value(rng));
  return v;
}

}  // namespace

TEST_CASE("cuBLASLt mapping of a plain GEMM swaps the operands and transposes the output",
          "[cuda_plan]") {
  // Row-major C (2 x 3) = A (2 x 4) @ B (4 x 3) is column-major C^T (3 x 2) = B^T (3 x 4) @
  // A^T (4 x 2), where B^T and A^T are B's and A's bytes read column-major.
  const GemmDesc desc{.m = 2, .n = 3, .k = 4};
  const LtGemmMapping map = map_gemm_to_cublaslt(desc);
  CHECK(map.a.source == GemmOperand::B);
  CHECK_FALSE(map.a.transpose);
  CHECK(map.a.layout.rows == 3);
  CHECK(map.a.layout.cols == 4);
  CHECK(map.a.layout.ld == 3);
  CHECK(map.b.source == GemmOperand::A);
  CHECK_FALSE(map.b.transpose);
  CHECK(map.b.layout.rows == 4);
  CHECK(map.b.layout.cols == 2);
  CHECK(map.b.layout.ld == 4);
  CHECK(map.c.rows == 3);
  CHECK(map.c.cols == 2);
  CHECK(map.c.ld == 3);
  CHECK(map.batch == 1);
}

TEST_CASE("cuBLASLt mapping keeps each operand's transpose and drops strides of a batch of one",
          "[cuda_plan]") {
  // A stored k x m = 4 x 2 (trans_a) is column-major 2 x 4 with ld 2; B stored n x k = 3 x 4
  // (trans_b) is column-major 4 x 3 with ld 4.
  const GemmDesc desc{.trans_a = true, .trans_b = true, .m = 2, .n = 3, .k = 4, .batch = 1,
                      .stride_a = 8, .stride_b = 12, .stride_c = 6};
  const LtGemmMapping map = map_gemm_to_cublaslt(desc);
  CHECK(map.a.source == GemmOperand::B);
  CHECK(map.a.transpose);
  CHECK(map.a.layout.rows == 4);
  CHECK(map.a.layout.cols == 3);
  CHECK(map.a.layout.ld == 4);
  CHECK(map.b.source == GemmOperand::A);
  CHECK(map.b.transpose);
  CHECK(map.b.layout.rows == 2);
  CHECK(map.b.layout.cols == 4);
  CHECK(map.b.layout.ld == 2);
  CHECK(map.a.layout.stride == 0);
  CHECK(map.b.layout.stride == 0);
  CHECK(map.c.stride == 0);
}

TEST_CASE("cuBLASLt mapping driven column-major reproduces the row-major GEMM contract",
          "[cuda_plan]") {
  std::mt19937 rng(20240611);
  std::uniform_int_distribution<int64_t> size(1, 5);
  std::uniform_int_distribution<int64_t> batch_size(1, 4);
  std::uniform_int_distribution<int> stride_kind(0, 2);
  std::uniform_int_distribution<int64_t> gap(1, 3);
  std::uniform_int_distribution<int> scalar(0, 2);
  constexpr float kAlphas[] = {1.0f, -2.0f, 0.5f};
  constexpr float kBetas[] = {0.0f, 1.0f, 0.25f};

  // 0 broadcasts the operand, `matrix` packs the batch, more leaves gaps between matrices.
  const auto input_stride = [&](int64_t matrix) -> int64_t {
    switch (stride_kind(rng)) {
      case 0: return 0;
      case 1: return matrix;
      default: return matrix + gap(rng);
    }
  };

  for (const bool trans_a : {false, true}) {
    for (const bool trans_b : {false, true}) {
      for (int trial = 0; trial < 40; ++trial) {
        GemmDesc d;
        d.trans_a = trans_a;
        d.trans_b = trans_b;
        d.m = size(rng);
        d.n = size(rng);
        d.k = size(rng);
        d.batch = batch_size(rng);
        d.stride_a = input_stride(d.m * d.k);
        d.stride_b = input_stride(d.k * d.n);
        // Outputs of a batch must not overlap; a batch of one may carry any stride.
        const int64_t packed_c = d.m * d.n + (trial % 3 == 0 ? gap(rng) : 0);
        d.stride_c = d.batch == 1 && trial % 2 == 0 ? 0 : packed_c;
        d.alpha = kAlphas[scalar(rng)];
        d.beta = kBetas[scalar(rng)];
        CAPTURE(d.trans_a, d.trans_b, d.m, d.n, d.k, d.batch, d.stride_a, d.stride_b,
                d.stride_c, d.alpha, d.beta);

        const std::vector<float> a = random_integers(rng, span(d.batch, d.stride_a, d.m * d.k));
        const std::vector<float> b = random_integers(rng, span(d.batch, d.stride_b, d.k * d.n));
        std::vector<float> expected = random_integers(rng, span(d.batch, d.stride_c, d.m * d.n));
        std::vector<float> actual = expected;

        row_major_reference(d, a, b, expected);
        const LtGemmMapping map = map_gemm_to_cublaslt(d);
        REQUIRE(map.batch == d.batch);
        column_major_matmul(map, a, b, d.alpha, d.beta, actual);
        // The whole buffer, so elements between the batch's outputs must stay untouched too.
        REQUIRE(actual == expected);
      }
    }
  }
}
