#include "cuda/kernels/param_step_table.h"

#include <cstring>

#include "core/dtype.h"
#include "core/error.h"

namespace mixprec::kernels {
namespace {

bool valid_working(int32_t dtype) {
  return dtype == kNoWorking || dtype == static_cast<int32_t>(DType::F32) ||
         dtype == static_cast<int32_t>(DType::F16) || dtype == static_cast<int32_t>(DType::BF16);
}

template <class Hyper, class Rates>
ParamStepTable make_table(const char* op,
                          const std::vector<ParamStepSource<Hyper, Rates>>& params) {
  ParamStepTable table;
  table.params = static_cast<int32_t>(params.size());
  std::vector<ParamStepEntry<Hyper>> entries;
  std::vector<Rates> rates;
  // The distinct tables stored so far: where each begins in `rates`, and its length.
  std::vector<std::pair<int32_t, int32_t>> stored;
  entries.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamStepSource<Hyper, Rates>& p = params[i];
    MIXPREC_CHECK(p.rates != nullptr && p.rates_count >= 1 && p.rates_count <= kMaxDeferredSteps,
                  op, ": parameter ", i, " needs 1 to ", kMaxDeferredSteps, " rates, got ",
                  p.rates == nullptr ? 0 : p.rates_count);
    MIXPREC_CHECK(valid_working(p.buffers.working_dtype), op, ": parameter ", i,
                  "'s working copy has the unsupported dtype value ", p.buffers.working_dtype);
    // An empty parameter's buffers may all be null.
    MIXPREC_CHECK(p.buffers.numel == 0 ||
                      (p.buffers.working == nullptr) == (p.buffers.working_dtype == kNoWorking),
                  op,
                  ": parameter ", i, p.buffers.working == nullptr
                                         ? " has a working dtype but no working copy"
                                         : " has a working copy but no working dtype");
    int32_t begin = -1;
    for (const auto& [first, count] : stored) {
      if (count == p.rates_count &&
          std::memcmp(rates.data() + first, p.rates, sizeof(Rates) * count) == 0) {
        begin = first;
        break;
      }
    }
    if (begin < 0) {
      begin = static_cast<int32_t>(rates.size());
      rates.insert(rates.end(), p.rates, p.rates + p.rates_count);
      stored.emplace_back(begin, p.rates_count);
    }
    ParamStepEntry<Hyper> entry;
    entry.hyper = p.hyper;
    entry.buffers = p.buffers;
    entry.first_chunk = table.chunks;
    entry.rates_begin = begin;
    entry.rates_count = p.rates_count;
    entries.push_back(entry);
    table.chunks += param_step_pieces(p.buffers.numel);
  }
  table.rates = static_cast<int32_t>(rates.size());
  table.rates_offset = param_step_rates_offset(sizeof(ParamStepEntry<Hyper>), table.params);
  table.bytes.assign(table.rates_offset + rates.size() * sizeof(Rates), 0);
  // Through void*: the structs' member initializers make GCC warn about memcpy, although
  // they are trivially copyable.
  if (!entries.empty()) {
    std::memcpy(static_cast<void*>(table.bytes.data()), static_cast<const void*>(entries.data()),
                entries.size() * sizeof(ParamStepEntry<Hyper>));
  }
  if (!rates.empty()) {
    std::memcpy(static_cast<void*>(table.bytes.data() + table.rates_offset),
                static_cast<const void*>(rates.data()), rates.size() * sizeof(Rates));
  }
  return table;
}

}  // namespace

ParamStepTable make_param_step_table(const char* op, const std::vector<AdamStepSource>& params) {
  return make_table(op, params);
}

ParamStepTable make_param_step_table(const char* op, const std::vector<SgdStepSource>& params) {
  return make_table(op, params);
}

}  // namespace mixprec::kernels
