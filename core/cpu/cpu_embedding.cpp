// Embedding lookup, its scatter-sum backward and dropout of the CPU backend.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/backend_checks.h"
#include "core/cpu/blocks.h"
#include "core/cpu/common.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/dispatch.h"
#include "core/math/dropout.h"
#include "core/math/embedding_parts.h"
#include "core/tensor.h"

namespace mixprec {
namespace {

using cpu::kParallelWork;

// Elements per task: whole Philox blocks (a multiple of 4), each evaluated once, whose keep
// decisions and FP32 values fit buffers on the stack.
constexpr int64_t kDropoutChunk = 4096;

// y = dropout(x), or with a residual y = residual + dropout(x), the dropout's value rounded
// to T first as the separate op would store it, then one add rounded once (binary's bits).
// y may alias x or the residual: each chunk is read before it is written.
template <class T>
void dropout_elements(const T* x, const T* residual, float p, PhiloxKey key, T* y, int64_t n) {
  const float scale = dropout_scale(p);
  const int64_t chunks = (n + kDropoutChunk - 1) / kDropoutChunk;
#pragma omp parallel for if (n > cpu::kParallelWorkCostly)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kDropoutChunk, count = std::min(kDropoutChunk, n - begin);
    uint8_t keep[kDropoutChunk];
    float values[kDropoutChunk];
    fill_dropout_keep(key, static_cast<uint64_t>(begin), count, p, keep);
    // 16-bit data widens and rounds back through the bulk converters (core/convert.h).
    const float* in = cpu::load_f32(x + begin, values, count);
    for (int64_t i = 0; i < count; ++i) values[i] = dropout_value(in[i], keep[i] != 0, scale);
    if (residual != nullptr) {
      float widened[kDropoutChunk];
      const float* r = cpu::load_f32(residual + begin, widened, count);
      for (int64_t i = 0; i < count; ++i) values[i] = r[i] + to_float(from_float<T>(values[i]));
    }
    cpu::store_f32(values, y + begin, count);
  }
}

// Every vocabulary row sums the dy rows of its positions in increasing position order, in
// FP32 parts (core/math/embedding_parts.h), and is rounded once: no atomics, so the result
// is the same for any thread count, and the CUDA backend's.
template <class T>
void embedding_backward_rows(const int32_t* ids, int64_t count, const T* dy, T* dweight,
                             int64_t vocab, int64_t dim) {
  // Counting sort of the positions by id (stable, so each id keeps its positions in order).
  std::vector<int64_t> start(static_cast<size_t>(vocab + 1), 0);
  for (int64_t i = 0; i < count; ++i) ++start[ids[i] + 1];
  for (int64_t v = 0; v < vocab; ++v) start[v + 1] += start[v];
  std::vector<int64_t> order(static_cast<size_t>(count));
  std::vector<int64_t> next(start.begin(), start.end() - 1);
  for (int64_t i = 0; i < count; ++i) order[next[ids[i]]++] = i;
  const int64_t parts = embedding_backward_parts(count, vocab, dim);

#pragma omp parallel if (vocab * dim + count * dim > kParallelWork)
  {
    std::vector<float> part(static_cast<size_t>(dim)), total(static_cast<size_t>(dim));
#pragma omp for schedule(dynamic, 16)
    for (int64_t v = 0; v < vocab; ++v) {
      const int64_t length = start[v + 1] - start[v];
      std::fill(total.begin(), total.end(), 0.0f);
      for (int64_t s = 0; s < parts; ++s) {
        std::fill(part.begin(), part.end(), 0.0f);
        const int64_t end = start[v] + embedding_part_begin(length, s + 1, parts);
        for (int64_t k = start[v] + embedding_part_begin(length, s, parts); k < end; ++k) {
          const T* row = dy + order[k] * dim;
          for (int64_t j = 0; j < dim; ++j) part[j] += to_float(row[j]);
        }
        // With one part, 0 + part is the part itself (a sum from +0 is never -0).
        for (int64_t j = 0; j < dim; ++j) total[j] += part[j];
      }
      T* out = dweight + v * dim;
      for (int64_t j = 0; j < dim; ++j) out[j] = from_float<T>(total[j]);
    }
  }
}

}  // namespace

void CpuBackend::embedding(const Tensor& weight, const Tensor& ids, Tensor& y) {
  const backend_checks::Rows dims = backend_checks::embedding(kCPU, weight, ids, y);
  const int64_t count = dims.rows, dim = dims.cols;
  const int32_t* id = ids.data_as<int32_t>();
  const size_t row_bytes = static_cast<size_t>(dim) * dtype_size(weight.dtype());
  const char* src = static_cast<const char*>(weight.data());
  char* dst = static_cast<char*>(y.data());
#pragma omp parallel for if (count * dim > kParallelWork)
  for (int64_t i = 0; i < count; ++i)
    std::memcpy(dst + i * row_bytes, src + static_cast<int64_t>(id[i]) * row_bytes, row_bytes);
}

void CpuBackend::embedding_backward(const Tensor& ids, const Tensor& dy, Tensor& dweight) {
  const int64_t dim = backend_checks::embedding_backward(kCPU, ids, dy, dweight).cols;
  const int64_t vocab = dweight.size(0);
  MIXPREC_DISPATCH_FLOATING(dweight.dtype(), "embedding_backward", [&] {
    embedding_backward_rows(ids.data_as<int32_t>(), ids.numel(),
                            static_cast<const scalar_t*>(dy.data()),
                            static_cast<scalar_t*>(dweight.data()), vocab, dim);
  });
}

void CpuBackend::dropout(const Tensor& x, float p, PhiloxKey key, Tensor& y) {
  backend_checks::dropout(kCPU, x, p, y);
  MIXPREC_DISPATCH_FLOATING(x.dtype(), "dropout", [&] {
    dropout_elements(static_cast<const scalar_t*>(x.data()), static_cast<const scalar_t*>(nullptr),
                     p, key, static_cast<scalar_t*>(y.data()), x.numel());
  });
}

void CpuBackend::dropout_add(const Tensor& residual, const Tensor& x, float p, PhiloxKey key,
                             Tensor& y) {
  backend_checks::dropout_add(kCPU, residual, x, p, y);
  MIXPREC_DISPATCH_FLOATING(x.dtype(), "dropout_add", [&] {
    dropout_elements(static_cast<const scalar_t*>(x.data()),
                     static_cast<const scalar_t*>(residual.data()), p, key,
                     static_cast<scalar_t*>(y.data()), x.numel());
  });
}

}  // namespace mixprec
