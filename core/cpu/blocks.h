// FP32 views of F32, F16 and BF16 data for the CPU kernels, which compute in FP32 only.
// 16-bit data is widened into FP32 buffers and rounded back from them with the vectorised
// bulk converters of core/convert.h (bit-identical to to_float/from_float, so each element
// is rounded once); F32 data is used in place and never copied.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/convert.h"
#include "core/half.h"

namespace mixprec::cpu {

// n elements of src as floats: src itself for F32, else src widened into buf (room for n
// floats), which is returned.
template <class T>
const float* load_f32(const T* src, float* buf, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return src;
  } else if constexpr (std::is_same_v<T, half>) {
    convert_f16_to_f32(reinterpret_cast<const uint16_t*>(src), buf, static_cast<size_t>(n));
    return buf;
  } else {
    static_assert(std::is_same_v<T, bfloat16>, "load_f32: F32, F16 or BF16 only");
    convert_bf16_to_f32(reinterpret_cast<const uint16_t*>(src), buf, static_cast<size_t>(n));
    return buf;
  }
}

// Where a kernel writes FP32 results bound for dst: dst itself for F32, else buf, which
// store_f32 then rounds into dst.
template <class T>
float* f32_target(T* dst, float* buf) {
  if constexpr (std::is_same_v<T, float>) return dst;
  else return buf;
}

// The calling thread's FP32 row buffer `slot` (0, 1 or 2) of at least n floats, kept between
// calls: row kernels widen 16-bit rows and keep per-row terms in them.
inline float* row_buffer(int slot, int64_t n) {
  thread_local std::vector<float> buffers[3];
  std::vector<float>& buffer = buffers[slot];
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(static_cast<size_t>(n));
  return buffer.data();
}

// Rounds n floats into dst. For F32 a copy, and nothing at all when src is dst (results
// written in place through f32_target).
template <class T>
void store_f32(const float* src, T* dst, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    if (src != dst) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  } else if constexpr (std::is_same_v<T, half>) {
    convert_f32_to_f16(src, reinterpret_cast<uint16_t*>(dst), static_cast<size_t>(n));
  } else {
    static_assert(std::is_same_v<T, bfloat16>, "store_f32: F32, F16 or BF16 only");
    convert_f32_to_bf16(src, reinterpret_cast<uint16_t*>(dst), static_cast<size_t>(n));
  }
}

// Elements per task of the parallel forms below. A conversion is memory-bound: a smaller one
// costs less than waking the team.
inline constexpr int64_t kConvertChunk = int64_t{1} << 20;

// f(begin, length) over [0, n) in kConvertChunk-element chunks that the threads share
// (serial when there is one chunk, or inside a parallel region that cannot nest). A single
// chunk opens no region at all: even one whose if clause is false costs a call into the
// OpenMP runtime, and the convolutions convert one image at a time.
template <class F>
void for_each_convert_chunk(int64_t n, const F& f) {
  const int64_t chunks = (n + kConvertChunk - 1) / kConvertChunk;
  if (chunks <= 1) {
    if (n > 0) f(0, n);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < chunks; ++i) {
    const int64_t begin = i * kConvertChunk;
    f(begin, std::min(kConvertChunk, n - begin));
  }
}

// load_f32 and store_f32 for whole tensors (GEMM operands, convolution filters and images):
// the same results, spread over the threads when n is large.
template <class T>
const float* load_f32_parallel(const T* src, float* buf, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return src;
  } else {
    for_each_convert_chunk(n, [&](int64_t begin, int64_t len) {
      load_f32(src + begin, buf + begin, len);
    });
    return buf;
  }
}

template <class T>
void store_f32_parallel(const float* src, T* dst, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    if (src == dst) return;
  }
  for_each_convert_chunk(n, [&](int64_t begin, int64_t len) {
    store_f32(src + begin, dst + begin, len);
  });
}

}  // namespace mixprec::cpu
