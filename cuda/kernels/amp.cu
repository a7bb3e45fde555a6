#include "cuda/kernels/amp.h"

#include <cstring>

#include "core/math/elementwise.h"
#include "cuda/kernels/amp_table.h"
#include "cuda/kernels/common.cuh"

namespace mixprec::kernels {
namespace {

// ---- the multi-tensor table (built by amp_table.cpp) -----------------------------------------

__device__ __forceinline__ int64_t chunk_length(const TableEntry& e, const TableChunk& c) {
  const int64_t rest = e.numel - c.begin;
  return rest < kMultiTensorChunk ? rest : kMultiTensorChunk;
}

constexpr int32_t kF32 = static_cast<int32_t>(DType::F32);
constexpr int32_t kF16 = static_cast<int32_t>(DType::F16);
constexpr int32_t kBF16 = static_cast<int32_t>(DType::BF16);

// ---- unscale and check ------------------------------------------------------------------------

template <class T>
__device__ __forceinline__ bool unscale_one(T& slot, double inv_scale, bool write) {
  if (!write) return !is_finite_value(to_float(slot));
  bool bad = false;
  slot = unscale_and_check_value(slot, inv_scale, bad);
  return bad;
}

// Applies `visit` to every element of one chunk, this thread's share of it: 16-byte packs
// where the chunk is aligned, one element at a time for the rest. Packs are stored back only
// when `write` is set.
template <class T, class Visit>
__device__ __forceinline__ void visit_span(T* p, int64_t len, bool write, Visit visit) {
  int64_t i = threadIdx.x;
  if (aligned_to(p, 16)) {
    constexpr int V = kVec<T>;
    using P = Pack<T, V>;
    const int64_t packs = len / V;
    for (int64_t k = threadIdx.x; k < packs; k += kThreads) {
      P v = reinterpret_cast<P*>(p)[k];
#pragma unroll
      for (int j = 0; j < V; ++j) visit(v.v[j]);
      if (write) reinterpret_cast<P*>(p)[k] = v;
    }
    i = packs * V + threadIdx.x;
  }
  for (; i < len; i += kThreads) visit(p[i]);
}

// One chunk by one block; true when this thread saw a non-finite value.
template <class T>
__device__ bool unscale_span(T* p, int64_t len, double inv_scale, bool write) {
  bool bad = false;
  visit_span(p, len, write, [&](T& x) { bad = unscale_one(x, inv_scale, write) || bad; });
  return bad;
}

// The scale of a DynamicScaleState kept as I32 words (update_loss_scale's state tensor): its
// first 8 bytes, copied through memcpy because the tensor guarantees only 4-byte alignment
// and the double needs 8.
__device__ __forceinline__ double state_scale(const int32_t* state) {
  static_assert(offsetof(DynamicScaleState, scale) == 0);
  double scale;
  memcpy(&scale, state, sizeof scale);
  return scale;
}

// scale_state (null: use inv_scale and write as given): inv_scale = 1 / S in double, and a
// pure check when that is 1, as the host-scale call decides on the host.
__global__ void __launch_bounds__(kThreads) unscale_kernel(const TableEntry* entries,
                                                          const TableChunk* chunks,
                                                          int64_t num_chunks, double inv_scale,
                                                          bool write, const int32_t* scale_state,
                                                          float* found_inf, int32_t* flags) {
  if (scale_state != nullptr) {
    inv_scale = 1.0 / state_scale(scale_state);
    write = inv_scale != 1.0;
  }
  for (int64_t c = blockIdx.x; c < num_chunks; c += gridDim.x) {
    const TableChunk chunk = chunks[c];
    const TableEntry e = entries[chunk.tensor];
    const int64_t len = chunk_length(e, chunk);
    bool bad = false;
    if (e.dtype == kF32) {
      bad = unscale_span(static_cast<float*>(e.data) + chunk.begin, len, inv_scale, write);
    } else if (e.dtype == kF16) {
      bad = unscale_span(static_cast<half*>(e.data) + chunk.begin, len, inv_scale, write);
    } else if (e.dtype == kBF16) {
      bad = unscale_span(static_cast<bfloat16*>(e.data) + chunk.begin, len, inv_scale, write);
    }
    // Every writer stores the same value, so the races between them are harmless.
    if (bad) {
      flags[chunk.tensor] = 1;
      *found_inf = 1.0f;
    }
  }
}

// ---- sums of squares -----------------------------------------------------------------------

// Thread t's share of one chunk: groups of V = kVec<T> consecutive elements t, t + kThreads,
// ... in order, then the tail element packs * V + t. The order is the same with or without
// vector loads, so the sum depends on the shape alone.
template <class T>
__device__ float sum_squares_span(const T* p, int64_t len) {
  constexpr int V = kVec<T>;
  using P = Pack<T, V>;
  const int64_t packs = len / V;
  const bool vector = aligned_to(p, 16);
  float acc = 0.0f;
  for (int64_t k = threadIdx.x; k < packs; k += kThreads) {
    P v;
    if (vector) {
      v = reinterpret_cast<const P*>(p)[k];
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) v.v[j] = p[k * V + j];
    }
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float x = to_float(v.v[j]);
      acc += x * x;
    }
  }
  for (int64_t i = packs * V + threadIdx.x; i < len; i += kThreads) {
    const float x = to_float(p[i]);
    acc += x * x;
  }
  return acc;
}

__global__ void __launch_bounds__(kThreads) chunk_squares_kernel(const TableEntry* entries,
                                                                const TableChunk* chunks,
                                                                int64_t num_chunks,
                                                                float* partials) {
  __shared__ float shared[kThreads];
  for (int64_t c = blockIdx.x; c < num_chunks; c += gridDim.x) {
    const TableChunk chunk = chunks[c];
    const TableEntry e = entries[chunk.tensor];
    const int64_t len = chunk_length(e, chunk);
    const int64_t begin = chunk.begin;
    float acc = 0.0f;
    if (e.dtype == kF32) {
      acc = sum_squares_span(static_cast<const float*>(e.data) + begin, len);
    } else if (e.dtype == kF16) {
      acc = sum_squares_span(static_cast<const half*>(e.data) + begin, len);
    } else if (e.dtype == kBF16) {
      acc = sum_squares_span(static_cast<const bfloat16*>(e.data) + begin, len);
    }
    const float total = block_sum(acc, shared);
    if (threadIdx.x == 0) partials[c] = total;
    __syncthreads();
  }
}

__global__ void __launch_bounds__(kThreads) tensor_norms_kernel(const TableEntry* entries,
                                                               int64_t tensors,
                                                               const float* partials,
                                                               float* out) {
  const int64_t stride = thread_stride();
  for (int64_t t = first_thread(); t < tensors; t += stride) {
    const TableEntry e = entries[t];
    // In double and rounded once, as the CPU backend combines its chunk sums.
    double total = 0.0;
    for (int32_t k = 0; k < e.chunk_count; ++k) total += partials[e.first_chunk + k];
    out[t] = static_cast<float>(total);
  }
}

// ---- widening 16-bit gradients -------------------------------------------------------------------

// One chunk by one block: four sources at a time, loaded as one 8-byte pack and stored as one
// 16-byte pack of floats where both sides are aligned for it, one element at a time for the
// rest. The sum with an accumulating target is one F32 add, as binary(Add) computes it.
template <class T>
__device__ void widen_span(const T* src, float* dst, int64_t len, bool accumulate) {
  constexpr int V = 4;
  int64_t i = threadIdx.x;
  if (aligned_to(src, V * sizeof(T)) && aligned_to(dst, V * sizeof(float))) {
    const int64_t packs = len / V;
    for (int64_t k = threadIdx.x; k < packs; k += kThreads) {
      const Pack<T, V> x = reinterpret_cast<const Pack<T, V>*>(src)[k];
      Pack<float, V> y;
      if (accumulate) y = reinterpret_cast<const Pack<float, V>*>(dst)[k];
#pragma unroll
      for (int j = 0; j < V; ++j) y.v[j] = accumulate ? y.v[j] + to_float(x.v[j]) : to_float(x.v[j]);
      reinterpret_cast<Pack<float, V>*>(dst)[k] = y;
    }
    i = packs * V + threadIdx.x;
  }
  for (; i < len; i += kThreads) dst[i] = accumulate ? dst[i] + to_float(src[i]) : to_float(src[i]);
}

__global__ void __launch_bounds__(kThreads) widen_kernel(const TableEntry* entries,
                                                        const TableChunk* chunks,
                                                        int64_t num_chunks,
                                                        const WidenTarget* targets) {
  for (int64_t c = blockIdx.x; c < num_chunks; c += gridDim.x) {
    const TableChunk chunk = chunks[c];
    const TableEntry e = entries[chunk.tensor];
    const WidenTarget target = targets[chunk.tensor];
    const int64_t len = chunk_length(e, chunk);
    float* dst = target.data + chunk.begin;
    if (e.dtype == kF16) {
      widen_span(static_cast<const half*>(e.data) + chunk.begin, dst, len, target.accumulate != 0);
    } else if (e.dtype == kBF16) {
      widen_span(static_cast<const bfloat16*>(e.data) + chunk.begin, dst, len,
                 target.accumulate != 0);
    }
  }
}

// ---- clipping by the total norm -----------------------------------------------------------------

// One thread: the sums in double in index order (the CPU backend's order), the norm and the
// coefficient, which stays on the device for the scale pass.
__global__ void total_norm_kernel(const float* squared_sums, int64_t count, double max_norm,
                                  float* norm_out, double* coef) {
  double total = 0.0;
  for (int64_t i = 0; i < count; ++i) total += static_cast<double>(squared_sums[i]);
  const double norm = sqrt(total);
  *norm_out = static_cast<float>(norm);
  *coef = clip_coefficient(norm, max_norm);
}

// Every F32 element g becomes affine_value(g, float(coef), 0) when coef < 1; otherwise the
// kernel returns before loading anything.
__global__ void __launch_bounds__(kThreads) clip_scale_kernel(const TableEntry* entries,
                                                             const TableChunk* chunks,
                                                             int64_t num_chunks,
                                                             const double* coef) {
  const double c = *coef;
  if (!(c < 1.0)) return;
  const float alpha = static_cast<float>(c);
  for (int64_t k = blockIdx.x; k < num_chunks; k += gridDim.x) {
    const TableChunk chunk = chunks[k];
    const TableEntry e = entries[chunk.tensor];
    float* p = static_cast<float*>(e.data) + chunk.begin;
    visit_span(p, chunk_length(e, chunk), true,
               [&](float& g) { g = affine_value(g, alpha, 0.0f); });
  }
}

// ---- the loss scale -----------------------------------------------------------------------------

// The state is copied through memcpy because the I32 tensor guarantees only 4-byte alignment,
// and the double inside needs 8.
__global__ void update_scale_kernel(DynamicScaleRule rule, int32_t* state,
                                    const float* found_inf) {
  DynamicScaleState s;
  // Through void*: the struct's member initializers make GCC warn about memcpy into it,
  // although it is trivially copyable (core/math/amp.h asserts so).
  memcpy(static_cast<void*>(&s), state, sizeof s);
  update_dynamic_scale(rule, s, *found_inf != 0.0f);
  memcpy(state, &s, sizeof s);
}

__global__ void loss_scale_factor_kernel(const int32_t* state, double weight, float* out) {
  *out = static_cast<float>(state_scale(state) * weight);
}

// A NaN flag is not 0, so it leaves the count, as any non-zero flag does.
__global__ void count_taken_step_kernel(const float* found_inf, int32_t* taken) {
  if (*found_inf == 0.0f) *taken += 1;
}

const TableEntry* table_entries(const void* device_table) {
  return static_cast<const TableEntry*>(device_table);
}

const TableChunk* table_chunks(const MultiTensorTable& table, const void* device_table) {
  return reinterpret_cast<const TableChunk*>(static_cast<const unsigned char*>(device_table) +
                                             table_chunks_offset(table.tensors));
}

unsigned chunk_grid(int64_t chunks) {
  return static_cast<unsigned>(std::min<int64_t>(chunks, kMaxBlocks));
}

}  // namespace

namespace {

void launch_unscale(const MultiTensorTable& table, const void* device_table, double inv_scale,
                    bool write, const int32_t* scale_state, float* found_inf, int32_t* flags,
                    cudaStream_t stream) {
  if (table.tensors == 0) return;
  CUDA_CHECK(cudaMemsetAsync(flags, 0, static_cast<size_t>(table.tensors) * sizeof(int32_t), stream));
  if (table.chunks == 0) return;
  MIXPREC_LAUNCH(chunk_grid(table.chunks), kThreads, stream, unscale_kernel)(
      table_entries(device_table), table_chunks(table, device_table), table.chunks, inv_scale,
      write, scale_state, found_inf, flags);
  CUDA_CHECK_LAST();
}

}  // namespace

void unscale_and_check(const MultiTensorTable& table, const void* device_table, double inv_scale,
                       bool write, float* found_inf, int32_t* flags, cudaStream_t stream) {
  launch_unscale(table, device_table, inv_scale, write, nullptr, found_inf, flags, stream);
}

void unscale_and_check_on_device(const MultiTensorTable& table, const void* device_table,
                                 const int32_t* scale_state, float* found_inf, int32_t* flags,
                                 cudaStream_t stream) {
  launch_unscale(table, device_table, 1.0, false, scale_state, found_inf, flags, stream);
}

void widen_gradients(const MultiTensorTable& table, const void* device_block,
                     cudaStream_t stream) {
  if (table.chunks == 0) return;
  const auto* targets = reinterpret_cast<const WidenTarget*>(
      static_cast<const unsigned char*>(device_block) + widen_targets_offset(table));
  MIXPREC_LAUNCH(chunk_grid(table.chunks), kThreads, stream, widen_kernel)(
      table_entries(device_block), table_chunks(table, device_block), table.chunks, targets);
  CUDA_CHECK_LAST();
}

void squared_norms(const MultiTensorTable& table, const void* device_table, float* partials,
                   float* out, cudaStream_t stream) {
  if (table.tensors == 0) return;
  if (table.chunks > 0) {
    MIXPREC_LAUNCH(chunk_grid(table.chunks), kThreads, stream, chunk_squares_kernel)(
        table_entries(device_table), table_chunks(table, device_table), table.chunks, partials);
    CUDA_CHECK_LAST();
  }
  MIXPREC_LAUNCH(grid_for(table.tensors), kThreads, stream, tensor_norms_kernel)(
      table_entries(device_table), table.tensors, partials, out);
  CUDA_CHECK_LAST();
}

void clip_by_total_norm(const MultiTensorTable& table, const void* device_table,
                        const float* squared_sums, double max_norm, float* norm_out,
                        double* coef, cudaStream_t stream) {
  MIXPREC_LAUNCH(1, 1, stream, total_norm_kernel)(squared_sums, table.tensors, max_norm, norm_out,
                                                  coef);
  CUDA_CHECK_LAST();
  if (table.chunks == 0) return;
  MIXPREC_LAUNCH(chunk_grid(table.chunks), kThreads, stream, clip_scale_kernel)(
      table_entries(device_table), table_chunks(table, device_table), table.chunks, coef);
  CUDA_CHECK_LAST();
}

void update_loss_scale(const DynamicScaleRule& rule, int32_t* state, const float* found_inf,
                       cudaStream_t stream) {
  MIXPREC_LAUNCH(1, 1, stream, update_scale_kernel)(rule, state, found_inf);
  CUDA_CHECK_LAST();
}

void loss_scale_factor(const int32_t* state, double weight, float* out, cudaStream_t stream) {
  MIXPREC_LAUNCH(1, 1, stream, loss_scale_factor_kernel)(state, weight, out);
  CUDA_CHECK_LAST();
}

void count_taken_step(const float* found_inf, int32_t* taken, cudaStream_t stream) {
  MIXPREC_LAUNCH(1, 1, stream, count_taken_step_kernel)(found_inf, taken);
  CUDA_CHECK_LAST();
}

}  // namespace mixprec::kernels
