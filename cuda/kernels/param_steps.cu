#include "cuda/kernels/param_steps.h"

#include <algorithm>
#include <type_traits>

#include "core/math/amp.h"
#include "cuda/kernels/common.cuh"

namespace mixprec::kernels {
namespace {

// Stands for "no working copy" in the template arguments.
struct NoWorking {};

// The optimizer-specific part of a step: loads its state for V elements starting at element
// i0 (relative to the piece), updates the V master values `w` from the gradients `g`, stores
// its state.
struct SgdElements {
  SgdHyper hyper;
  float* momentum;  // null when hyper.momentum == 0
  template <int V>
  __device__ __forceinline__ void operator()(int64_t i0, Pack<float, V>& w,
                                             const Pack<float, V>& g) const {
    Pack<float, V> b;
    if (momentum != nullptr) b = *reinterpret_cast<const Pack<float, V>*>(momentum + i0);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      float buf = momentum != nullptr ? b.v[j] : 0.0f;
      sgd_update(w.v[j], g.v[j], buf, hyper);
      b.v[j] = buf;
    }
    if (momentum != nullptr) *reinterpret_cast<Pack<float, V>*>(momentum + i0) = b;
  }
  __device__ __forceinline__ bool state_aligned() const {
    return momentum == nullptr || aligned_to(momentum, 16);
  }
};

struct AdamElements {
  AdamHyper hyper;
  float* exp_avg;
  float* exp_avg_sq;
  template <int V>
  __device__ __forceinline__ void operator()(int64_t i0, Pack<float, V>& w,
                                             const Pack<float, V>& g) const {
    Pack<float, V> m = *reinterpret_cast<const Pack<float, V>*>(exp_avg + i0);
    Pack<float, V> v = *reinterpret_cast<const Pack<float, V>*>(exp_avg_sq + i0);
#pragma unroll
    for (int j = 0; j < V; ++j) adam_update(w.v[j], g.v[j], m.v[j], v.v[j], hyper);
    *reinterpret_cast<Pack<float, V>*>(exp_avg + i0) = m;
    *reinterpret_cast<Pack<float, V>*>(exp_avg_sq + i0) = v;
  }
  __device__ __forceinline__ bool state_aligned() const {
    return aligned_to(exp_avg, 16) && aligned_to(exp_avg_sq, 16);
  }
};

// What the kernel needs to know of an optimizer: its hyperparameters and rates, how a rate
// applies to the base, and its Elements over one piece's state.
struct SgdKind {
  using Hyper = SgdHyper;
  using Rates = SgdStepRates;
  __device__ static SgdElements elements(const SgdHyper& base, const SgdStepRates& rates,
                                         const ParamStepBuffers& b, int64_t begin) {
    return {sgd_hyper_with(base, rates), b.state0 != nullptr ? b.state0 + begin : nullptr};
  }
};

struct AdamKind {
  using Hyper = AdamHyper;
  using Rates = AdamStepRates;
  __device__ static AdamElements elements(const AdamHyper& base, const AdamStepRates& rates,
                                          const ParamStepBuffers& b, int64_t begin) {
    return {adam_hyper_with(base, rates), b.state0 + begin, b.state1 + begin};
  }
};

// One piece of one parameter by one block: V elements per iteration (packs of V floats, and
// V working elements), the rest one by one. Pointers are the piece's own.
template <int V, class Elements, class W>
__device__ void update_piece(const Elements& step, float* master, const float* grad, W* working,
                             int64_t len) {
  using PF = Pack<float, V>;
  const int64_t packs = len / V;
  for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
    PF w = reinterpret_cast<const PF*>(master)[p];
    const PF g = reinterpret_cast<const PF*>(grad)[p];
    step.template operator()<V>(p * V, w, g);
    reinterpret_cast<PF*>(master)[p] = w;
    if constexpr (!std::is_same_v<W, NoWorking>) {
      Pack<W, V> out;
#pragma unroll
      for (int j = 0; j < V; ++j) out.v[j] = from_float<W>(w.v[j]);
      reinterpret_cast<Pack<W, V>*>(working)[p] = out;
    }
  }
  for (int64_t i = packs * V + threadIdx.x; i < len; i += blockDim.x) {
    Pack<float, 1> w, g;
    w.v[0] = master[i];
    g.v[0] = grad[i];
    step.template operator()<1>(i, w, g);
    master[i] = w.v[0];
    if constexpr (!std::is_same_v<W, NoWorking>) working[i] = from_float<W>(w.v[0]);
  }
}

// Packs of four where every pointer of the piece allows them, else element by element.
template <class Elements, class W>
__device__ void dispatch_piece(const Elements& step, float* master, const float* grad,
                               W* working, int64_t len) {
  constexpr int V = 4;
  bool vector = aligned_to(master, 16) && aligned_to(grad, 16) && step.state_aligned();
  if constexpr (!std::is_same_v<W, NoWorking>)
    vector = vector && aligned_to(working, V * sizeof(W));
  if (vector) update_piece<V>(step, master, grad, working, len);
  else update_piece<1>(step, master, grad, working, len);
}

// The flag is read before anything else, so a skipped step costs one load per thread. Each
// parameter then picks its rate j = *taken (0 for an immediate step) or sits the step out
// when j is outside its table. The working copy's dtype is switched on per piece rather than
// dispatched once per launch: one launch serves parameters of different working dtypes.
template <class Kind>
__global__ void __launch_bounds__(kThreads) param_steps_kernel(
    const ParamStepEntry<typename Kind::Hyper>* entries, int32_t params,
    const typename Kind::Rates* rates, int64_t chunks, const int32_t* taken,
    const float* found_inf) {
  if (found_inf != nullptr && *found_inf != 0.0f) return;
  const int32_t j = taken != nullptr ? *taken : 0;
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const ParamStepEntry<typename Kind::Hyper>& e = entries[param_step_owner(entries, params, c)];
    if (j < 0 || j >= e.rates_count) continue;
    const ParamStepBuffers& b = e.buffers;
    const int64_t begin = (c - e.first_chunk) * kParamStepChunk;
    const int64_t rest = b.numel - begin;
    const int64_t len = rest < kParamStepChunk ? rest : kParamStepChunk;
    const auto step = Kind::elements(e.hyper, rates[e.rates_begin + j], b, begin);
    float* master = b.master + begin;
    const float* grad = b.grad + begin;
    switch (b.working_dtype) {
      case static_cast<int32_t>(DType::F32):
        dispatch_piece(step, master, grad, static_cast<float*>(b.working) + begin, len);
        break;
      case static_cast<int32_t>(DType::F16):
        dispatch_piece(step, master, grad, static_cast<half*>(b.working) + begin, len);
        break;
      case static_cast<int32_t>(DType::BF16):
        dispatch_piece(step, master, grad, static_cast<bfloat16*>(b.working) + begin, len);
        break;
      default:
        dispatch_piece(step, master, grad, static_cast<NoWorking*>(nullptr), len);
        break;
    }
  }
}

template <class Kind>
void launch_param_steps(const ParamStepTable& table, const void* device_table,
                        const int32_t* taken, const float* found_inf, cudaStream_t stream) {
  if (table.chunks == 0) return;
  using Entry = ParamStepEntry<typename Kind::Hyper>;
  const auto* entries = static_cast<const Entry*>(device_table);
  const auto* rates = reinterpret_cast<const typename Kind::Rates*>(
      static_cast<const unsigned char*>(device_table) + table.rates_offset);
  const unsigned grid = static_cast<unsigned>(std::min(table.chunks, kMaxBlocks));
  MIXPREC_LAUNCH(grid, kThreads, stream, param_steps_kernel<Kind>)(entries, table.params, rates,
                                                                   table.chunks, taken,
                                                                   found_inf);
  CUDA_CHECK_LAST();
}

}  // namespace

void adam_steps(const ParamStepTable& table, const void* device_table, const int32_t* taken,
                const float* found_inf, cudaStream_t stream) {
  launch_param_steps<AdamKind>(table, device_table, taken, found_inf, stream);
}

void sgd_steps(const ParamStepTable& table, const void* device_table, const int32_t* taken,
               const float* found_inf, cudaStream_t stream) {
  launch_param_steps<SgdKind>(table, device_table, taken, found_inf, stream);
}

}  // namespace mixprec::kernels
