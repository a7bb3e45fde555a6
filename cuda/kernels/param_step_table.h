// The table of a multi-tensor optimizer step (Backend::adam_steps / sgd_steps): written on
// the host by make_param_step_table, read on the device by the param-steps kernel
// (cuda/kernels/param_steps.h). Free of CUDA headers so that it can be checked on a machine
// without a device.
//
// Layout: `params` ParamStepEntry<Hyper>, then, from the first 16-byte boundary after them
// (ParamStepTable::rates_offset), the entries of every distinct rate table, each table's
// entries in a row. Parameters whose tables hold the same bytes (the usual case: one table
// for the parameters with weight decay, one for those without) share one copy, so the
// upload stays small however many parameters there are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/hd.h"
#include "core/math/amp.h"

namespace mixprec::kernels {

// Elements of one parameter that one block updates; a parameter's pieces are
// [c * kParamStepChunk, min((c + 1) * kParamStepChunk, numel)). A multiple of 4 elements,
// so every piece of a 16-byte aligned tensor starts 16-byte aligned.
inline constexpr int64_t kParamStepChunk = 4096;
static_assert(kParamStepChunk % 4 == 0, "a piece must keep 16-byte alignment");

// working_dtype of a parameter without a working copy.
inline constexpr int32_t kNoWorking = -1;

// One parameter's operands: device pointers.
struct ParamStepBuffers {
  float* master = nullptr;
  const float* grad = nullptr;
  float* state0 = nullptr;  // Adam: exp_avg; SGD: the momentum buffer (null without momentum)
  float* state1 = nullptr;  // Adam: exp_avg_sq; SGD: null
  void* working = nullptr;  // null: none
  int32_t working_dtype = kNoWorking;  // a DType value (F32, F16, BF16) or kNoWorking
  int64_t numel = 0;
};

// One parameter as the host describes it: its base hyperparameters and the `rates_count`
// rates the device picks from (entry j after j taken pending steps; one entry for an
// immediate step, rates_of(hyper)).
template <class Hyper, class Rates>
struct ParamStepSource {
  Hyper hyper;
  const Rates* rates = nullptr;
  int32_t rates_count = 0;
  ParamStepBuffers buffers;
};

using AdamStepSource = ParamStepSource<AdamHyper, AdamStepRates>;
using SgdStepSource = ParamStepSource<SgdHyper, SgdStepRates>;

// One parameter as the kernel reads it.
template <class Hyper>
struct ParamStepEntry {
  Hyper hyper;
  ParamStepBuffers buffers;
  int64_t first_chunk = 0;  // its pieces are first_chunk .. first_chunk + pieces - 1
  int32_t rates_begin = 0;  // index of its entry 0 among all the table's rates
  int32_t rates_count = 0;
};

// The host writes the entries and the device reads them: both compilers must lay them out
// alike. These pin the layout on each side (the CUDA build compiles this header with nvcc
// too), so a difference fails to compile instead of corrupting the table.
static_assert(std::is_trivially_copyable_v<ParamStepEntry<AdamHyper>> &&
              std::is_trivially_copyable_v<ParamStepEntry<SgdHyper>>);
static_assert(sizeof(AdamHyper) == 48 && sizeof(SgdHyper) == 20 &&
              sizeof(ParamStepBuffers) == 56);
static_assert(sizeof(ParamStepEntry<AdamHyper>) == 120 &&
              offsetof(ParamStepEntry<AdamHyper>, buffers) == 48 &&
              offsetof(ParamStepEntry<AdamHyper>, first_chunk) == 104 &&
              offsetof(ParamStepEntry<AdamHyper>, rates_begin) == 112);
static_assert(sizeof(ParamStepEntry<SgdHyper>) == 96 &&
              offsetof(ParamStepEntry<SgdHyper>, buffers) == 24 &&
              offsetof(ParamStepEntry<SgdHyper>, first_chunk) == 80 &&
              offsetof(ParamStepEntry<SgdHyper>, rates_begin) == 88);
static_assert(sizeof(AdamStepRates) == 24 && sizeof(SgdStepRates) == 8,
              "rate tables are compared byte for byte: no padding");

// The parameter that piece c belongs to: the last entry whose first piece is <= c (an empty
// parameter shares its first_chunk with the next one, which is the one that owns c). The
// kernel calls it for every piece; params >= 1 and c < the table's chunks.
template <class Hyper>
MIXPREC_HD int32_t param_step_owner(const ParamStepEntry<Hyper>* entries, int32_t params,
                                    int64_t c) {
  int32_t lo = 0, hi = params - 1;
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) / 2;
    if (entries[mid].first_chunk <= c) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

struct ParamStepTable {
  std::vector<unsigned char> bytes;  // to be copied to the device as they are
  int32_t params = 0;
  int64_t chunks = 0;        // pieces of all parameters; 0: nothing to launch
  size_t rates_offset = 0;   // where the rates start in `bytes`
  int32_t rates = 0;         // rates stored (after sharing)
};

// Throws mixprec::Error (naming `op` and the parameter) for a rates_count outside
// [1, kMaxDeferredSteps], null rates, a working dtype that is not F32, F16 or BF16, or a
// working pointer without a working dtype or the reverse (in a parameter of any elements).
ParamStepTable make_param_step_table(const char* op, const std::vector<AdamStepSource>& params);
ParamStepTable make_param_step_table(const char* op, const std::vector<SgdStepSource>& params);

// Number of pieces of a parameter of `numel` elements.
inline int64_t param_step_pieces(int64_t numel) {
  return (numel + kParamStepChunk - 1) / kParamStepChunk;
}

inline size_t param_step_rates_offset(size_t entry_bytes, int32_t params) {
  return (static_cast<size_t>(params) * entry_bytes + 15) / 16 * 16;
}

}  // namespace mixprec::kernels
