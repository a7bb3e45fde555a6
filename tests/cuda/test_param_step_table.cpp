// The table of the multi-tensor optimizer steps (cuda/kernels/param_step_table.h), checked
// without a device: the host builder's bytes are decoded with the layout the kernel reads.
// Every parameter gets ceil(numel / kParamStepChunk) pieces numbered after those of the
// parameters before it; the rates start on a 16-byte boundary after the entries; rate tables
// with the same bytes are stored once and each entry's rates_begin finds its own rates.
// Buffer pointers are distinct fake addresses; nothing dereferences them.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "cuda/kernels/param_step_table.h"

namespace {

using namespace mixprec;
using namespace mixprec::kernels;

template <class T>
T* fake_address(size_t i, size_t which) {
  return reinterpret_cast<T*>(uintptr_t{0x100000} * (i + 1) + uintptr_t{0x1000} * which);
}

// Parameter i's buffers at fake addresses; `working` a DType value or kNoWorking.
ParamStepBuffers buffers(size_t i, int64_t numel, int32_t working) {
  ParamStepBuffers b;
  b.master = fake_address<float>(i, 0);
  b.grad = fake_address<const float>(i, 1);
  b.state0 = fake_address<float>(i, 2);
  b.state1 = fake_address<float>(i, 3);
  b.working = working == kNoWorking ? nullptr : fake_address<void>(i, 4);
  b.working_dtype = working;
  b.numel = numel;
  return b;
}

template <class Hyper, class Rates>
struct Decoded {
  std::vector<ParamStepEntry<Hyper>> entries;
  std::vector<Rates> rates;
};

// The entries and rates as the kernel finds them, after checking the layout's arithmetic.
template <class Hyper, class Rates>
Decoded<Hyper, Rates> decode(const ParamStepTable& table) {
  using Entry = ParamStepEntry<Hyper>;
  const size_t entry_bytes = static_cast<size_t>(table.params) * sizeof(Entry);
  REQUIRE(table.rates_offset % 16 == 0);
  REQUIRE(table.rates_offset >= entry_bytes);
  REQUIRE(table.rates_offset < entry_bytes + 16);  // the first boundary, no further
  REQUIRE(table.rates_offset == param_step_rates_offset(sizeof(Entry), table.params));
  REQUIRE(table.bytes.size() ==
          table.rates_offset + static_cast<size_t>(table.rates) * sizeof(Rates));
  Decoded<Hyper, Rates> out;
  out.entries.resize(static_cast<size_t>(table.params));
  out.rates.resize(static_cast<size_t>(table.rates));
  if (!out.entries.empty())
    std::memcpy(static_cast<void*>(out.entries.data()), table.bytes.data(), entry_bytes);
  if (!out.rates.empty()) {
    std::memcpy(static_cast<void*>(out.rates.data()), table.bytes.data() + table.rates_offset,
                out.rates.size() * sizeof(Rates));
  }
  return out;
}

void check_buffers(const ParamStepBuffers& got, const ParamStepBuffers& want) {
  CHECK(got.master == want.master);
  CHECK(got.grad == want.grad);
  CHECK(got.state0 == want.state0);
  CHECK(got.state1 == want.state1);
  CHECK(got.working == want.working);
  CHECK(got.working_dtype == want.working_dtype);
  CHECK(got.numel == want.numel);
}

// Rates of a decaying schedule from step t0; `lr0` tells tables apart.
std::vector<AdamStepRates> adam_rates(int32_t count, float lr0, int64_t t0) {
  std::vector<AdamStepRates> rates;
  for (int32_t j = 0; j < count; ++j) {
    AdamHyper h;
    h.lr = lr0 * (1.0f - 0.01f * static_cast<float>(j));
    h.weight_decay = 0.1f;
    h.decoupled_weight_decay = true;
    h.set_step(t0 + j);
    rates.push_back(rates_of(h));
  }
  return rates;
}

std::vector<SgdStepRates> sgd_rates(int32_t count, float lr0, bool first) {
  std::vector<SgdStepRates> rates;
  for (int32_t j = 0; j < count; ++j)
    rates.push_back({lr0 * (1.0f - 0.01f * static_cast<float>(j)), first && j == 0 ? 1 : 0});
  return rates;
}

// Whether the `count` rates from `begin` in the decoded table hold `want`'s bytes.
template <class Rates>
bool rates_at(const std::vector<Rates>& stored, int32_t begin, const std::vector<Rates>& want) {
  if (begin < 0 || static_cast<size_t>(begin) + want.size() > stored.size()) return false;
  return std::memcmp(stored.data() + begin, want.data(), want.size() * sizeof(Rates)) == 0;
}

constexpr int32_t kF32 = static_cast<int32_t>(DType::F32);
constexpr int32_t kF16 = static_cast<int32_t>(DType::F16);
constexpr int32_t kBF16 = static_cast<int32_t>(DType::BF16);

}  // namespace

TEST_CASE("param step table numbers every parameter's pieces after those before it",
          "[cuda_plan]") {
  constexpr int64_t kChunk = kParamStepChunk;
  const std::vector<int64_t> sizes = {0, 1, kChunk - 1, kChunk, kChunk + 1, 3 * kChunk + 5, 0};
  // ceil(numel / 4096), counted by hand from `sizes`, and their running totals.
  const std::vector<int64_t> pieces = {0, 1, 1, 1, 2, 4, 0};
  const std::vector<int64_t> first = {0, 0, 1, 2, 3, 5, 9};
  const int32_t workings[] = {kNoWorking, kF16, kBF16, kF32, kNoWorking, kF16, kBF16};
  const std::vector<AdamStepRates> rates = adam_rates(1, 1e-3f, 1);
  std::vector<AdamStepSource> sources;
  for (size_t i = 0; i < sizes.size(); ++i) {
    AdamStepSource s;
    s.hyper.lr = 1e-3f * static_cast<float>(i + 1);  // a field per parameter, to find again
    s.hyper.eps = 1e-6f;
    s.hyper.weight_decay = 0.01f * static_cast<float>(i);
    s.hyper.decoupled_weight_decay = i % 2 == 1;
    s.rates = rates.data();
    s.rates_count = 1;
    s.buffers = buffers(i, sizes[i], workings[i]);
    sources.push_back(s);
  }
  const ParamStepTable table = make_param_step_table("test", sources);
  CHECK(table.params == static_cast<int32_t>(sizes.size()));
  CHECK(table.chunks == 9);
  const auto decoded = decode<AdamHyper, AdamStepRates>(table);
  for (size_t i = 0; i < sizes.size(); ++i) {
    CAPTURE(i, sizes[i]);
    CHECK(param_step_pieces(sizes[i]) == pieces[i]);
    const ParamStepEntry<AdamHyper>& e = decoded.entries[i];
    CHECK(e.first_chunk == first[i]);
    // The pieces of the parameter cover it: the last one starts inside it.
    if (pieces[i] > 0) CHECK((pieces[i] - 1) * kChunk < sizes[i]);
    CHECK(pieces[i] * kChunk >= sizes[i]);
    check_buffers(e.buffers, sources[i].buffers);
    CHECK(e.hyper.lr == sources[i].hyper.lr);
    CHECK(e.hyper.eps == sources[i].hyper.eps);
    CHECK(e.hyper.weight_decay == sources[i].hyper.weight_decay);
    CHECK(e.hyper.decoupled_weight_decay == sources[i].hyper.decoupled_weight_decay);
    // One immediate rate, shared by all.
    CHECK(e.rates_begin == 0);
    CHECK(e.rates_count == 1);
  }
  CHECK(table.rates == 1);
  CHECK(rates_at(decoded.rates, 0, rates));
}

TEST_CASE("param step owner maps every piece to the parameter that holds it", "[cuda_plan]") {
  // The kernel's lookup, run on the host over the decoded entries: empty parameters first,
  // in runs in the middle and last must never own a piece.
  constexpr int64_t kChunk = kParamStepChunk;
  const std::vector<int64_t> sizes = {0, 0, 5, 0, kChunk + 1, 0, 0, 0, 2 * kChunk, 1, 0};
  const std::vector<AdamStepRates> rates = adam_rates(1, 1e-3f, 1);
  std::vector<AdamStepSource> sources;
  for (size_t i = 0; i < sizes.size(); ++i) {
    AdamStepSource s;
    s.rates = rates.data();
    s.rates_count = 1;
    s.buffers = buffers(i, sizes[i], kNoWorking);
    sources.push_back(s);
  }
  const ParamStepTable table = make_param_step_table("test", sources);
  const auto decoded = decode<AdamHyper, AdamStepRates>(table);
  REQUIRE(table.chunks == 1 + 2 + 2 + 1);
  // The owners of the pieces in order, and the piece's place inside its owner.
  const std::vector<int32_t> owners = {2, 4, 4, 8, 8, 9};
  for (int64_t c = 0; c < table.chunks; ++c) {
    CAPTURE(c);
    const int32_t owner = param_step_owner(decoded.entries.data(), table.params, c);
    CHECK(owner == owners[static_cast<size_t>(c)]);
    const ParamStepEntry<AdamHyper>& e = decoded.entries[static_cast<size_t>(owner)];
    CHECK(e.first_chunk <= c);
    CHECK((c - e.first_chunk) * kChunk < e.buffers.numel);
  }
}

TEST_CASE("param step table stores identical rate tables once and distinct ones apart",
          "[cuda_plan]") {
  // Three parameters with equal rates held in three different arrays (as three optimizer
  // parameters build them), one with the same count but other rates, two with one rate.
  const std::vector<std::vector<AdamStepRates>> tables = {
      adam_rates(3, 1e-3f, 5), adam_rates(3, 1e-3f, 5), adam_rates(1, 2e-3f, 1),
      adam_rates(3, 5e-4f, 5), adam_rates(3, 1e-3f, 5), adam_rates(1, 2e-3f, 1)};
  std::vector<AdamStepSource> sources;
  for (size_t i = 0; i < tables.size(); ++i) {
    AdamStepSource s;
    s.rates = tables[i].data();
    s.rates_count = static_cast<int32_t>(tables[i].size());
    s.buffers = buffers(i, 100 * static_cast<int64_t>(i + 1), kF16);
    sources.push_back(s);
  }
  const ParamStepTable table = make_param_step_table("test", sources);
  // 3 + 1 + 3: the first table, the one-rate table and the other three-rate table.
  CHECK(table.rates == 7);
  const auto decoded = decode<AdamHyper, AdamStepRates>(table);
  for (size_t i = 0; i < tables.size(); ++i) {
    CAPTURE(i);
    const ParamStepEntry<AdamHyper>& e = decoded.entries[i];
    CHECK(e.rates_count == static_cast<int32_t>(tables[i].size()));
    CHECK(rates_at(decoded.rates, e.rates_begin, tables[i]));
  }
  const auto& e = decoded.entries;
  CHECK(e[1].rates_begin == e[0].rates_begin);
  CHECK(e[4].rates_begin == e[0].rates_begin);
  CHECK(e[5].rates_begin == e[2].rates_begin);
  CHECK(e[3].rates_begin != e[0].rates_begin);
  CHECK(e[2].rates_begin != e[0].rates_begin);
}

TEST_CASE("param step table of SGD steps keeps first_step apart and shares the rest",
          "[cuda_plan]") {
  // first_step differs in entry 0 only: a parameter starting its buffer cannot share the
  // rates of one that already has it.
  const std::vector<std::vector<SgdStepRates>> tables = {
      sgd_rates(4, 0.1f, false), sgd_rates(4, 0.1f, true), sgd_rates(4, 0.1f, false),
      sgd_rates(kMaxDeferredSteps, 0.1f, false)};
  std::vector<SgdStepSource> sources;
  for (size_t i = 0; i < tables.size(); ++i) {
    SgdStepSource s;
    s.hyper.momentum = 0.9f;
    s.hyper.nesterov = i == 2;
    s.rates = tables[i].data();
    s.rates_count = static_cast<int32_t>(tables[i].size());
    s.buffers = buffers(i, 4097, i == 3 ? kNoWorking : kBF16);
    s.buffers.state1 = nullptr;  // SGD has one state buffer
    sources.push_back(s);
  }
  const ParamStepTable table = make_param_step_table("test", sources);
  CHECK(table.chunks == 4 * 2);
  CHECK(table.rates == 4 + 4 + kMaxDeferredSteps);
  const auto decoded = decode<SgdHyper, SgdStepRates>(table);
  for (size_t i = 0; i < tables.size(); ++i) {
    CAPTURE(i);
    const ParamStepEntry<SgdHyper>& e = decoded.entries[i];
    CHECK(e.first_chunk == 2 * static_cast<int64_t>(i));
    CHECK(e.rates_count == static_cast<int32_t>(tables[i].size()));
    CHECK(rates_at(decoded.rates, e.rates_begin, tables[i]));
    CHECK(e.hyper.nesterov == (i == 2));
    check_buffers(e.buffers, sources[i].buffers);
  }
  CHECK(decoded.entries[2].rates_begin == decoded.entries[0].rates_begin);
  CHECK(decoded.entries[1].rates_begin != decoded.entries[0].rates_begin);
}

TEST_CASE("param step table of no parameters or only empty ones has no pieces", "[cuda_plan]") {
  const ParamStepTable none = make_param_step_table("test", std::vector<AdamStepSource>{});
  CHECK(none.params == 0);
  CHECK(none.chunks == 0);
  CHECK(none.rates == 0);
  CHECK(none.bytes.empty());

  const std::vector<SgdStepRates> rates = sgd_rates(2, 0.1f, true);
  std::vector<SgdStepSource> sources(3);
  for (size_t i = 0; i < sources.size(); ++i) {
    sources[i].rates = rates.data();
    sources[i].rates_count = 2;
    sources[i].buffers = buffers(i, 0, kF16);
  }
  const ParamStepTable empty = make_param_step_table("test", sources);
  CHECK(empty.params == 3);
  CHECK(empty.chunks == 0);
  const auto decoded = decode<SgdHyper, SgdStepRates>(empty);
  for (const ParamStepEntry<SgdHyper>& e : decoded.entries) {
    CHECK(e.first_chunk == 0);
    CHECK(e.buffers.numel == 0);
  }
}

TEST_CASE("param step table rejects bad rate counts, null rates and bad working copies",
          "[cuda_plan]") {
  const std::vector<AdamStepRates> rates = adam_rates(kMaxDeferredSteps + 1, 1e-3f, 1);
  // Parameter 0 is valid; parameter 1 is spoiled by `spoil`, and the message names it.
  auto build = [&](auto spoil) {
    std::vector<AdamStepSource> sources(2);
    for (size_t i = 0; i < sources.size(); ++i) {
      sources[i].rates = rates.data();
      sources[i].rates_count = 2;
      sources[i].buffers = buffers(i, 10, kF16);
    }
    spoil(sources[1]);
    return make_param_step_table("adam_steps", sources);
  };
  // Separate matchers: a combination of them (&&) keeps only references to its parts.
  auto op = Catch::Contains("adam_steps");
  auto param = Catch::Contains("parameter 1");
  CHECK_THROWS_WITH(build([](AdamStepSource& s) { s.rates_count = 0; }),
                    op && param && Catch::Contains("rates"));
  CHECK_THROWS_WITH(build([](AdamStepSource& s) { s.rates_count = kMaxDeferredSteps + 1; }),
                    op && param && Catch::Contains("rates"));
  CHECK_THROWS_WITH(build([](AdamStepSource& s) { s.rates = nullptr; }),
                    op && param && Catch::Contains("rates"));
  CHECK_THROWS_WITH(build([](AdamStepSource& s) { s.rates_count = -1; }), op && param);
  CHECK_THROWS_WITH(build([](AdamStepSource& s) {
                      s.buffers.working_dtype = static_cast<int32_t>(DType::I32);
                    }),
                    op && param && Catch::Contains("dtype"));
  CHECK_THROWS_WITH(build([](AdamStepSource& s) { s.buffers.working_dtype = 77; }),
                    op && param && Catch::Contains("dtype"));
  // The limits themselves are valid.
  CHECK_NOTHROW(build([](AdamStepSource& s) { s.rates_count = kMaxDeferredSteps; }));
  CHECK_NOTHROW(build([](AdamStepSource& s) { s.rates_count = 1; }));
  CHECK_NOTHROW(build([](AdamStepSource& s) {
    s.buffers.working = nullptr;
    s.buffers.working_dtype = kNoWorking;
  }));
  // A dtype without a pointer would write through null; a pointer without a dtype is never
  // written, which the caller cannot have meant.
  CHECK_THROWS_WITH(build([](AdamStepSource& s) { s.buffers.working = nullptr; }),
                    op && param && Catch::Contains("no working copy"));
  CHECK_THROWS_WITH(build([](AdamStepSource& s) { s.buffers.working_dtype = kNoWorking; }),
                    op && param && Catch::Contains("no working dtype"));
  // An empty parameter's buffers may all be null.
  CHECK_NOTHROW(build([](AdamStepSource& s) {
    s.buffers = ParamStepBuffers{};
    s.buffers.working_dtype = kF16;
  }));

  std::vector<SgdStepSource> sgd(1);
  sgd[0].rates = nullptr;
  sgd[0].rates_count = 1;
  CHECK_THROWS_AS(make_param_step_table("sgd_steps", sgd), Error);
}
